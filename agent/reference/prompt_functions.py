"""The pieces read by running the checkout's own code: `prompt_utils.py`'s prompt functions (once its
imports are checked to be the standard library's) and `process_input` of `input_handler.py`, alone. The rest
of the pieces are read from the source without running it."""

from __future__ import annotations

import ast
import datetime
import sys
from typing import Any

from nanbeige.agent.reference.reader import FILES, Reader, ReferenceError

# Standard modules the reference's prompt functions never need: a checkout whose prompt module imports one of
# them is not the reference's, and is not run. (This is no sandbox: `os` alone can do as much; naming a
# checkout is trusting it.)
REACHING_OUT = frozenset(
    {
        "subprocess",
        "socket",
        "ssl",
        "ctypes",
        "multiprocessing",
        "concurrent",
        "asyncio",
        "pty",
        "http",
        "urllib",
        "ftplib",
        "smtplib",
        "imaplib",
        "poplib",
        "telnetlib",
        "xmlrpc",
        "importlib",
        "runpy",
        "pickle",
        "marshal",
        "shutil",
        "webbrowser",
        "signal",
    }
)


def _prompt_module(reader: Reader) -> dict[str, Any]:
    """`prompt_utils.py` run (once) in a namespace of its own, after its imports are checked to be the
    standard library's only: the checkout's dependencies need not be installed here."""
    if reader.prompt_namespace is not None:
        return reader.prompt_namespace
    relative = FILES["prompts"]
    tree = reader.tree(relative)
    for node in ast.walk(tree):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or "."]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        outside = [n for n in names if n.split(".")[0] not in sys.stdlib_module_names]
        if outside or (isinstance(node, ast.ImportFrom) and node.level):
            raise ReferenceError(
                f"{relative} imports {(outside or ['a relative module'])[0]}, beyond the standard "
                "library, so its functions are not run"
            )
        reaching = [n for n in names if n.split(".")[0] in REACHING_OUT]
        if reaching:
            raise ReferenceError(
                f"{relative} imports {reaching[0]}, which prompt texts have no use for (it starts "
                "programs, opens connections or loads code), so its functions are not run"
            )
    namespace: dict[str, Any] = {"__name__": "miroflow_reference_prompts"}
    try:
        exec(compile(tree, relative, "exec"), namespace)  # noqa: S102 (the user's own checkout)
    except (Exception, SystemExit) as exc:  # its module body failed: say so, never a traceback
        raise ReferenceError(f"{relative} failed to load: {type(exc).__name__}: {exc}") from None
    reader.prompt_namespace = namespace
    return namespace


def read_system_prompt(reader: Reader) -> tuple[dict[str, Any], str]:
    namespace = _prompt_module(reader)
    build = namespace.get("generate_mcp_system_prompt")
    objective = namespace.get("generate_agent_specific_system_prompt")
    if not callable(build) or not callable(objective):
        raise ReferenceError(
            f"{FILES['prompts']} has no generate_mcp_system_prompt / generate_agent_specific_system_prompt"
        )
    try:
        sample = build(datetime.date(2000, 1, 2), [])
        main = objective(agent_type="main")
    except (Exception, SystemExit) as exc:
        raise ReferenceError(f"the system prompt functions failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(sample, str) or "2000-01-02" not in sample or not isinstance(main, str):
        raise ReferenceError("generate_mcp_system_prompt does not give a prompt with the date in it")
    return {"mcp_system_prompt": build, "agent_objective": main}, f"{len(sample)} characters before the tools"


def read_summary_prompt(reader: Reader) -> tuple[dict[str, Any], str]:
    summarize = _prompt_module(reader).get("generate_agent_summarize_prompt")
    try:
        sample = summarize("QUESTION", agent_type="main") if callable(summarize) else None
    except (Exception, SystemExit) as exc:
        raise ReferenceError(f"generate_agent_summarize_prompt failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(sample, str) or "QUESTION" not in sample:
        raise ReferenceError(f"{FILES['prompts']} has no generate_agent_summarize_prompt for the main agent")
    return {"summary_prompt_function": summarize}, f"{len(sample) - len('QUESTION')} characters around the question"


def read_user_message(reader: Reader) -> tuple[dict[str, Any], str]:
    """`process_input` of `input_handler.py`, which turns the task into the first user message. The
    module imports document converters, so the function alone is run, in a namespace of standard
    modules: without a task file it uses nothing else."""
    relative = FILES["input"]
    found = [
        node
        for node in reader.tree(relative).body
        if isinstance(node, ast.FunctionDef) and node.name == "process_input"
    ]
    if len(found) != 1:
        raise ReferenceError(f"{relative} has no function process_input")
    import json
    import os
    import traceback
    import typing

    namespace: dict[str, Any] = {
        "__name__": "miroflow_reference_input",
        "os": os,
        "json": json,
        "traceback": traceback,
        **{n: getattr(typing, n) for n in typing.__all__},
    }
    try:
        exec(compile(ast.Module(body=found, type_ignores=[]), relative, "exec"), namespace)  # noqa: S102
        process_input = namespace["process_input"]
        sample = process_input("QUESTION", None)
    except (Exception, SystemExit) as exc:
        raise ReferenceError(f"{relative}: process_input failed: {type(exc).__name__}: {exc}") from None
    if not (isinstance(sample, tuple) and isinstance(sample[0], str) and "QUESTION" in sample[0]):
        raise ReferenceError(f"{relative}: process_input does not give the user message first")
    return {"process_input": process_input}, f"{len(sample[0]) - len('QUESTION')} characters added to the question"
