"""The readers of `agent/reference/checkout.py`: each finds one text or rule the model reads in a checkout of
MiroThinker and says what it found, or raises ReferenceError naming what is missing."""

from __future__ import annotations

import ast
import datetime
import hashlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The reference requires Python >= 3.12 and its lock file resolves for 3.12 and 3.13, so which one
# ran it is not known. They differ in the tool descriptions the model read: 3.13's compiler strips
# the indentation of docstrings, and MCP SDK 1.x sends `__doc__` as it is (NANBEIGE_REFERENCE_PYTHON).
PYTHONS = ("3.12", "3.13")
MAX_FILE_BYTES = 5_000_000  # the largest source file read (the reference's are under 100 kB)
FILES = {
    "prompts": "apps/miroflow-agent/src/utils/prompt_utils.py",
    "input": "apps/miroflow-agent/src/io/input_handler.py",
    "orchestrator": "apps/miroflow-agent/src/core/orchestrator.py",
    "tool-python": "libs/miroflow-tools/src/miroflow_tools/mcp_servers/python_mcp_server.py",
    "search_and_scrape_webpage": "libs/miroflow-tools/src/miroflow_tools/dev_mcp_servers/search_and_scrape_webpage.py",
    "jina_scrape_llm_summary": "libs/miroflow-tools/src/miroflow_tools/dev_mcp_servers/jina_scrape_llm_summary.py",
    "llm": "apps/miroflow-agent/conf/llm/default.yaml",
    "llm_model": "apps/miroflow-agent/conf/llm/qwen-3.yaml",
    "evaluator": "apps/miroflow-agent/benchmarks/evaluators/eval_utils.py",
}
# The evaluator's judge prompts (module-level templates it fills with `.format(question=, correct_answer=,
# response=)`), by the name our judges share.
JUDGE_PROMPTS = {"browsecomp": "JUDGE_PROMPT_BC_en", "browsecomp-zh": "JUDGE_PROMPT_BC_zh", "hle": "HLE_JUDGE_PROMPT",
                 "xbench": "JUDGE_PROMPT_XBENCH", "equivalent": "GAIA_VALIDATION_TEXT_103_SCORER_PROMPT"}
# The keep-5 agent config: named `single_agent_keep5` at v1.0 and `mirothinker_v1.0_keep5` later.
AGENT_CONFIGS = ("apps/miroflow-agent/conf/agent/mirothinker_v1.0_keep5.yaml",
                 "apps/miroflow-agent/conf/agent/single_agent_keep5.yaml")
ANSWER_GENERATOR = "apps/miroflow-agent/src/core/answer_generator.py"  # the summary's home in later layouts
TOOL_SERVERS = ("tool-python", "search_and_scrape_webpage", "jina_scrape_llm_summary")
# The duplicate-query note is the orchestrator's f-string whose fields are exactly these variables
# (its names for them, and ours).
_DUPLICATE_FIELDS = {"query_str": "query", "tool_name": "tool"}


class ReferenceError(Exception):
    """The checkout cannot be read, or lacks a text the model needs (the message names it)."""


class Reader:
    """Reads files of the checkout, each once, keeping what was read for the hash."""

    def __init__(self, root: Path, python: str = "3.12"):
        self.root = root
        self.python = python
        self.read_files: dict[str, bytes] = {}
        self.prompt_namespace: dict[str, Any] | None = None  # prompt_utils.py, run once

    def text(self, relative: str) -> str:
        if relative not in self.read_files:
            path = self.root / relative
            try:
                if not path.is_file():  # a folder, a pipe or a device is no source file
                    raise ReferenceError(f"{relative} is missing or not a regular file")
                if path.stat().st_size > MAX_FILE_BYTES:
                    raise ReferenceError(f"{relative} is larger than {MAX_FILE_BYTES // 1_000_000} MB")
                self.read_files[relative] = path.read_bytes()
            except OSError as exc:
                raise ReferenceError(f"cannot read {relative}: {exc.strerror or exc}") from None
        try:
            return self.read_files[relative].decode("utf-8")
        except UnicodeDecodeError:
            raise ReferenceError(f"{relative} is not UTF-8 text") from None

    def tree(self, relative: str) -> ast.Module:
        try:
            return ast.parse(self.text(relative), filename=relative)
        except SyntaxError as exc:
            raise ReferenceError(f"{relative} is not Python this interpreter can parse: {exc.msg}") from None
        except (ValueError, RecursionError, MemoryError) as exc:  # a NUL byte, nesting too deep
            raise ReferenceError(f"{relative} cannot be parsed: {type(exc).__name__}") from None

    def exists(self, relative: str) -> bool:
        try:
            return (self.root / relative).is_file()
        except OSError:
            return False

    def digest(self) -> str:
        sha = hashlib.sha256()
        for relative in sorted(self.read_files):
            data = self.read_files[relative]
            sha.update(f"{relative}\0{len(data)}\0".encode() + data)
        return sha.hexdigest()


# ---------------------------------------------------------------- the pieces


# Standard modules the reference's prompt functions never need: a checkout whose prompt module imports one of
# them is not the reference's, and is not run. (This is no sandbox: `os` alone can do as much; naming a
# checkout is trusting it.)
REACHING_OUT = frozenset({"subprocess", "socket", "ssl", "ctypes", "multiprocessing", "concurrent", "asyncio", "pty",
                          "http", "urllib", "ftplib", "smtplib", "imaplib", "poplib", "telnetlib", "xmlrpc",
                          "importlib", "runpy", "pickle", "marshal", "shutil", "webbrowser", "signal"})


def _prompt_module(reader: Reader) -> dict[str, Any]:
    """`prompt_utils.py` run (once) in a namespace of its own, after its imports are checked to be the
    standard library's only: the checkout's dependencies need not be installed here."""
    if reader.prompt_namespace is not None:
        return reader.prompt_namespace
    relative = FILES["prompts"]
    tree = reader.tree(relative)
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or "."] if isinstance(node, ast.ImportFrom) else []
        outside = [n for n in names if n.split(".")[0] not in sys.stdlib_module_names]
        if outside or (isinstance(node, ast.ImportFrom) and node.level):
            raise ReferenceError(f"{relative} imports {(outside or ['a relative module'])[0]}, beyond the standard "
                                 "library, so its functions are not run")
        reaching = [n for n in names if n.split(".")[0] in REACHING_OUT]
        if reaching:
            raise ReferenceError(f"{relative} imports {reaching[0]}, which prompt texts have no use for (it starts "
                                 "programs, opens connections or loads code), so its functions are not run")
    namespace: dict[str, Any] = {"__name__": "miroflow_reference_prompts"}
    try:
        exec(compile(tree, relative, "exec"), namespace)  # noqa: S102 (the user's own checkout)
    except (Exception, SystemExit) as exc:  # its module body failed: say so, never a traceback
        raise ReferenceError(f"{relative} failed to load: {type(exc).__name__}: {exc}") from None
    reader.prompt_namespace = namespace
    return namespace


def _read_system_prompt(reader: Reader) -> tuple[dict[str, Any], str]:
    namespace = _prompt_module(reader)
    build = namespace.get("generate_mcp_system_prompt")
    objective = namespace.get("generate_agent_specific_system_prompt")
    if not callable(build) or not callable(objective):
        raise ReferenceError(f"{FILES['prompts']} has no generate_mcp_system_prompt / "
                             "generate_agent_specific_system_prompt")
    try:
        sample = build(datetime.date(2000, 1, 2), [])
        main = objective(agent_type="main")
    except (Exception, SystemExit) as exc:
        raise ReferenceError(f"the system prompt functions failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(sample, str) or "2000-01-02" not in sample or not isinstance(main, str):
        raise ReferenceError("generate_mcp_system_prompt does not give a prompt with the date in it")
    return {"mcp_system_prompt": build, "agent_objective": main}, f"{len(sample)} characters before the tools"


def _read_summary_prompt(reader: Reader) -> tuple[dict[str, Any], str]:
    summarize = _prompt_module(reader).get("generate_agent_summarize_prompt")
    try:
        sample = summarize("QUESTION", agent_type="main") if callable(summarize) else None
    except (Exception, SystemExit) as exc:
        raise ReferenceError(f"generate_agent_summarize_prompt failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(sample, str) or "QUESTION" not in sample:
        raise ReferenceError(f"{FILES['prompts']} has no generate_agent_summarize_prompt for the main agent")
    return {"summary_prompt_function": summarize}, f"{len(sample) - len('QUESTION')} characters around the question"


def _read_tags(reader: Reader) -> tuple[dict[str, Any], str]:
    values = {name: _literal(reader, FILES["prompts"], name) for name in ("mcp_tags", "refusal_keywords")}
    if not all(isinstance(v, list) and v and all(isinstance(s, str) for s in v) for v in values.values()):
        raise ReferenceError(f"{FILES['prompts']} has no lists mcp_tags and refusal_keywords")
    return ({"mcp_tags": tuple(values["mcp_tags"]), "refusals": tuple(values["refusal_keywords"])},
            f"{len(values['mcp_tags'])} malformed-call tags, {len(values['refusal_keywords'])} refusal phrases")


def _read_user_message(reader: Reader) -> tuple[dict[str, Any], str]:
    """`process_input` of `input_handler.py`, which turns the task into the first user message. The
    module imports document converters, so the function alone is run, in a namespace of standard
    modules: without a task file it uses nothing else."""
    relative = FILES["input"]
    found = [node for node in reader.tree(relative).body
             if isinstance(node, ast.FunctionDef) and node.name == "process_input"]
    if len(found) != 1:
        raise ReferenceError(f"{relative} has no function process_input")
    import json
    import os
    import traceback
    import typing

    namespace: dict[str, Any] = {"__name__": "miroflow_reference_input", "os": os, "json": json,
                                 "traceback": traceback, **{n: getattr(typing, n) for n in typing.__all__}}
    try:
        exec(compile(ast.Module(body=found, type_ignores=[]), relative, "exec"), namespace)  # noqa: S102
        process_input = namespace["process_input"]
        sample = process_input("QUESTION", None)
    except (Exception, SystemExit) as exc:
        raise ReferenceError(f"{relative}: process_input failed: {type(exc).__name__}: {exc}") from None
    if not (isinstance(sample, tuple) and isinstance(sample[0], str) and "QUESTION" in sample[0]):
        raise ReferenceError(f"{relative}: process_input does not give the user message first")
    return {"process_input": process_input}, f"{len(sample[0]) - len('QUESTION')} characters added to the question"


def _read_duplicate_query(reader: Reader) -> tuple[dict[str, Any], str]:
    """The note a repeated query gets (v1.0), as a template; None when the orchestrator has none
    (from 2025-12-28 a repeat is rolled back)."""
    tree = reader.tree(FILES["orchestrator"])
    notes = {_fstring_template(node) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
             and _field_names(node) == set(_DUPLICATE_FIELDS)}
    if len(notes) > 1:
        raise ReferenceError(f"{FILES['orchestrator']} has {len(notes)} different duplicate-query notes")
    tools = _query_tools(tree)
    if notes:
        return ({"duplicate_query": notes.pop(), "query_tools": tools},
                f"a note answers a repeated query of {', '.join(tools) or 'no tool of ours'}")
    return ({"duplicate_query": None, "query_tools": tools},
            "a repeated query is rolled back (no note in the orchestrator)")


def _query_tools(tree: ast.Module) -> tuple[str, ...]:
    """Which of our tools the orchestrator's query-string function (`_get_query_str_from_tool_call`)
    compares `tool_name` with; the later layout has it in another file and rolls repeats back."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.endswith("get_query_str_from_tool_call"):
            names = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            return tuple(t for t in ("google_search", "scrape_and_extract_info") if t in names)
    return ("google_search", "scrape_and_extract_info")


def _field_names(node: ast.JoinedStr) -> set[str]:
    return {value.value.id if isinstance(value.value, ast.Name) else "" for value in node.values
            if isinstance(value, ast.FormattedValue)}


def _read_summary_tries(reader: Reader) -> tuple[dict[str, Any], str]:
    """The number of summary tries, from the assignment to `...final_answer_retries` (in the
    orchestrator, or in the answer generator of later layouts): a number, or `A if ... keep_tool_result
    == -1 else B`. None at all (v1.0): one try."""
    for relative in (FILES["orchestrator"], ANSWER_GENERATOR):
        if relative != FILES["orchestrator"] and not reader.exists(relative):
            continue
        tree = reader.tree(relative)
        constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant) for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(t, ast.Attribute) and t.attr.lower().endswith("final_answer_retries") for t in targets):
                tries = _tries(node.value, constants)
                return {"summary_tries": tries}, f"{tries[0]} with keep -1, else {tries[1]}"
    return {"summary_tries": (1, 1)}, "one try"


def _tries(value: ast.expr, constants: dict[str, Any]) -> tuple[int, int]:
    def number(node: ast.expr) -> int:
        found = node.value if isinstance(node, ast.Constant) else constants.get(getattr(node, "id", ""))
        if not isinstance(found, int) or not 1 <= found <= 100:
            raise ReferenceError("the number of summary tries is not a number this version reads")
        return found
    if isinstance(value, ast.IfExp) and "keep_tool_result" in ast.unparse(value.test) \
            and "-1" in ast.unparse(value.test):
        return number(value.body), number(value.orelse)
    return number(value), number(value)


def _read_placeholder_ids(reader: Reader) -> tuple[dict[str, Any], str]:
    """The made-up sandbox ids tool-python refuses (`INVALID_SANDBOX_IDS`), and what it answers them:
    the f-string returned where a tool checks `sandbox_id in INVALID_SANDBOX_IDS`, its `[ERROR]: `
    left to our server, which puts it before every error."""
    relative = FILES["tool-python"]
    ids = _literal(reader, relative, "INVALID_SANDBOX_IDS")
    if not isinstance(ids, (set, list, tuple)) or not all(isinstance(i, str) for i in ids):
        raise ReferenceError(f"{relative}: INVALID_SANDBOX_IDS is not a set of ids")
    texts = set()
    for node in ast.walk(reader.tree(relative)):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "sandbox_id in INVALID_SANDBOX_IDS":
            texts |= {_fstring_template(n.value, {"sandbox_id": "sandbox_id"}) for n in node.body
                      if isinstance(n, ast.Return) and isinstance(n.value, ast.JoinedStr)}
    if len(texts) != 1 or not next(iter(texts)).startswith("[ERROR]: "):
        raise ReferenceError(f"{relative}: no single `[ERROR]: ` answer to a placeholder sandbox id")
    text = texts.pop().removeprefix("[ERROR]: ")
    return {"placeholder_ids": frozenset(ids), "placeholder_text": text}, f"{len(ids)} ids, one error answer"


def _fstring_template(node: ast.JoinedStr, fields: dict[str, str] | None = None) -> str:
    """The f-string as a `str.format` template, its fields renamed by `fields` (the reference's
    variable names to ours; by default the duplicate-query note's)."""
    fields = _DUPLICATE_FIELDS if fields is None else fields
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value).replace("{", "{{").replace("}", "}}"))
        elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name) \
                and value.value.id in fields and value.conversion == -1 and value.format_spec is None:
            parts.append("{" + fields[value.value.id] + "}")
        else:
            raise ReferenceError("an f-string of the reference has a field this version does not know")
    return "".join(parts)


def _read_tool_descriptions(reader: Reader) -> tuple[dict[str, Any], str]:
    descriptions = {}
    for server in TOOL_SERVERS:
        for name, doc in _tool_docstrings(reader, FILES[server]).items():
            descriptions[(server, name)] = doc
    for needed in (("tool-python", "run_python_code"), ("search_and_scrape_webpage", "google_search"),
                   ("jina_scrape_llm_summary", "scrape_and_extract_info")):
        if needed not in descriptions:
            raise ReferenceError(f"{FILES[needed[0]]} has no tool {needed[1]} with a docstring")
    return {"tool_descriptions": descriptions}, f"{len(descriptions)} tools"


def _tool_docstrings(reader: Reader, relative: str) -> dict[str, str]:
    """The docstrings of the functions registered with `@<server>.tool()`, as `__doc__` holds them on
    the Python the reference ran on (MCP SDK 1.x takes a tool's description from `__doc__`): raw on
    3.12, as 3.13's compiler cleans them with `reader.python` "3.13"."""
    docs = {}
    for node in reader.tree(relative).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(_is_tool_decorator(d)
                                                                            for d in node.decorator_list):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                docs[node.name] = compiled_docstring(doc) if reader.python == "3.13" else doc
    return docs


def compiled_docstring(raw: str) -> str:
    """A docstring as Python 3.13's compiler stores it: tabs expanded, the first line's leading spaces
    removed, and the smallest indentation of the later non-blank lines removed from each later line
    (from a line of spaces alone, at most that many)."""
    lines = raw.expandtabs().split("\n")
    margin = min((len(line) - len(line.lstrip(" ")) for line in lines[1:] if line.strip(" ")), default=0)
    return "\n".join([lines[0].lstrip(" ")] + [line[min(margin, len(line) - len(line.lstrip(" "))):]
                                               for line in lines[1:]])


def _is_tool_decorator(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return isinstance(target, ast.Attribute) and target.attr == "tool"


def _read_extraction_prompt(reader: Reader) -> tuple[dict[str, Any], str]:
    prompt = _literal(reader, FILES["jina_scrape_llm_summary"], "EXTRACT_INFO_PROMPT")
    if not isinstance(prompt, str) or prompt.count("{}") != 2:
        raise ReferenceError(f"{FILES['jina_scrape_llm_summary']} has no EXTRACT_INFO_PROMPT with two fields")
    return {"extraction_prompt": prompt}, f"{len(prompt)} characters"


def _read_settings(reader: Reader) -> tuple[dict[str, Any], str]:
    import yaml

    agent = next((p for p in AGENT_CONFIGS if reader.exists(p)), None)
    if agent is None:
        raise ReferenceError(f"no keep-5 agent config ({' or '.join(AGENT_CONFIGS)})")
    settings: dict[str, Any] = {}
    for relative in (FILES["llm"], FILES["llm_model"], agent):
        try:
            data = yaml.safe_load(reader.text(relative)) or {}
        except yaml.YAMLError as exc:
            raise ReferenceError(f"{relative} is not YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ReferenceError(f"{relative} is not a YAML mapping")
        main = data.get("main_agent") if isinstance(data.get("main_agent"), dict) else {}
        settings |= {k: data[k] for k in ("temperature", "top_p", "max_tokens", "max_context_length",
                                          "repetition_penalty", "keep_tool_result") if k in data}
        settings |= {"max_turns": main["max_turns"]} if "max_turns" in main else {}
    return {"settings": settings}, ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))


def _read_judge_prompts(reader: Reader) -> tuple[dict[str, Any], str]:
    """The evaluator's judge prompts, where the checkout has the evaluator (optional: the judges use our
    own prompts without it). A template counts only with exactly the three fields it is filled with."""
    import string

    relative = FILES["evaluator"]
    if not reader.exists(relative):
        return {"judge_prompts": {}}, f"{relative} is not in this checkout: the judges use nanbeige's prompts"
    prompts = {}
    for judge, name in JUDGE_PROMPTS.items():
        try:
            text = _stripped_text(reader, relative, name)
            fields = {field for _, field, _, _ in string.Formatter().parse(text) if field is not None}
        except (ReferenceError, ValueError, TypeError, AttributeError):
            continue
        if isinstance(text, str) and fields == {"question", "correct_answer", "response"}:
            prompts[judge] = text
    return {"judge_prompts": prompts}, f"{', '.join(sorted(prompts)) or 'none'} from {relative}"


def _stripped_text(reader: Reader, relative: str, name: str) -> str:
    """A module-level text assigned to `name`, stripped where the source calls `.strip()` on it."""
    for node in reader.tree(relative).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value, strip = node.value, False
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "strip" \
                    and not value.args and not value.keywords:
                value, strip = value.func.value, True
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value.strip() if strip else value.value
            raise ReferenceError(f"{relative}: {name} is not a text")
    raise ReferenceError(f"{relative} has no {name}")


def _literal(reader: Reader, relative: str, name: str) -> Any:
    """The value of a module-level `name = <literal>` in a file, read without running it."""
    for node in reader.tree(relative).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                raise ReferenceError(f"{relative}: {name} is not a literal") from None
    raise ReferenceError(f"{relative} has no {name}")


# Each piece gives Reference fields and a line for `nanbeige reference check`.
PIECES: list[tuple[str, Callable[[Reader], tuple[dict[str, Any], str]]]] = [
    ("system prompt", _read_system_prompt),
    ("summary prompt", _read_summary_prompt),
    ("malformed-call tags and refusals", _read_tags),
    ("user message", _read_user_message),
    ("duplicate-query rule", _read_duplicate_query),
    ("summary tries", _read_summary_tries),
    ("tool descriptions", _read_tool_descriptions),
    ("page-extraction prompt", _read_extraction_prompt),
    ("placeholder sandbox ids", _read_placeholder_ids),
    ("keep-5 agent settings", _read_settings),
    ("judge prompts", _read_judge_prompts),
]
