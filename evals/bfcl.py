"""BFCL (Berkeley Function Calling Leaderboard, V4): the single-turn AST categories, read from the data that
ships in the `bfcl-eval` package and graded by that package's own AST checker.

    pip install --no-deps bfcl-eval==2026.3.23   # its pinned dependencies are model SDKs the checker never runs

    tasks = load("simple_python")
    calls, reply = await run_bfcl_task(tasks[0], llm)
    verdict = grade(tasks[0], calls)

A task is one model call: the item's first turn (its messages as written, system message included) with
the item's functions offered as tools; the calls in the reply are graded, never executed.

The checker module imports the package's whole model registry, and through it every vendor SDK, only to
ask one thing of it: whether a model's tool names had "." turned into "_". `_ast_checker` loads the
checker's file unchanged with a one-entry registry in its place, so grading needs no extra packages.
Tool names are mapped back to the original dotted names before grading, so that entry answers "no".
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanbeige.evals.files import read_jsonl
from nanbeige.evals.tasks import LoadError, Task, Verdict

if TYPE_CHECKING:
    from nanbeige.agent.llm import LLM

PACKAGE = "bfcl-eval==2026.3.23"
INSTALL = f"pip install --no-deps {PACKAGE}"
PREFIX = "BFCL_v4_"
# The single-turn categories the AST checker grades, by BFCL's own names (the data files' names after the
# prefix). All are Python; the checker routes on "parallel" / "multiple" in the name.
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple",
              "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
ALIASES = {"simple": "simple_python"}
GRADER = "bfcl-ast"
# The model name the checker is given; its registry entry says our tool names are the original ones.
CHECKER_MODEL = "nanbeige"
SERVER = "bfcl"  # the server name the tool-call parser needs; BFCL tools belong to no server
# BFCL's type names that JSON schema spells differently ("any" has no counterpart: it is left untyped).
JSON_TYPES = {"dict": "object", "float": "number", "tuple": "array"}


# ---------------------------------------------------------------- loading


def package_data() -> Path:
    """The `data` folder of the installed bfcl-eval package."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise LoadError(f"BFCL needs the bfcl-eval package: {INSTALL}")
    return Path(spec.submodule_search_locations[0]) / "data"


def category_name(category: str) -> str:
    name = ALIASES.get(category, category)
    if name not in CATEGORIES:
        raise LoadError(f"unknown BFCL category {category!r}; known: {', '.join(CATEGORIES)} "
                        f"(and {', '.join(ALIASES)} for {', '.join(ALIASES.values())})")
    return name


def load(category: str, data_dir: Path | None = None) -> list[Task]:
    """The category's items, from the installed package's data or from `data_dir` (the same layout: the
    question file in it, the answer file in its `possible_answer/` folder)."""
    name = category_name(category)
    folder = Path(data_dir) if data_dir is not None else package_data()
    questions_path = folder / f"{PREFIX}{name}.json"
    answers_path = folder / "possible_answer" / f"{PREFIX}{name}.json"
    questions, answers = read_jsonl(questions_path), read_jsonl(answers_path)
    ground_truths = {}
    for number, row in enumerate(answers, 1):
        if "id" not in row or not isinstance(row.get("ground_truth"), list):
            raise LoadError(f"{answers_path} row {number}: needs an id and a ground_truth list")
        ground_truths[str(row["id"])] = row["ground_truth"]
    return [_task(questions_path, number, row, name, ground_truths) for number, row in enumerate(questions, 1)]


def _task(path: Path, number: int, row: dict[str, Any], category: str, ground_truths: dict[str, list]) -> Task:
    task_id = str(row.get("id", ""))
    turns, functions = row.get("question"), row.get("function")
    if not task_id or not isinstance(turns, list) or not turns or not isinstance(turns[0], list) \
            or not isinstance(functions, list):
        raise LoadError(f"{path} row {number}: needs an id, a non-empty question (a list of turns) and a "
                        "function list")
    if task_id not in ground_truths:
        raise LoadError(f"{path} row {number}: {task_id} has no ground truth in possible_answer/")
    messages = turns[0]
    user_text = "\n\n".join(m.get("content") or "" for m in messages if m.get("role") == "user")
    system = [m.get("content") or "" for m in messages if m.get("role") == "system"]
    ground_truth = ground_truths[task_id]
    return Task(
        id=task_id,
        question=user_text,
        answer=json.dumps(ground_truth, ensure_ascii=False),
        level=category,
        metadata={"category": category, "functions": functions, "ground_truth": ground_truth,
                  "messages": messages, "system": system[0] if system else None},
    )


# ---------------------------------------------------------------- tools


def tool_name(name: str) -> str:
    """A BFCL function name as a valid tool name (OpenAI allows [A-Za-z0-9_-], up to 64): dots become
    underscores, as BFCL itself does for function-calling models."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]


def name_map(functions: list[dict[str, Any]]) -> dict[str, str]:
    """Tool name -> the function's original BFCL name, for grading."""
    return {tool_name(f["name"]): f["name"] for f in functions}


PYTHON_NOTE = " Note that the provided function is in Python 3 syntax."
"""What BFCL's own runner appends to every function description of these (Python) categories."""


def tools_for(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The BFCL functions as OpenAI-style tools, with JSON-schema types throughout, described as BFCL
    describes them to the models it scores."""
    return [{"type": "function", "function": {
        "name": tool_name(f["name"]),
        "description": (f.get("description") or "") + PYTHON_NOTE,
        "parameters": _schema(f.get("parameters") or {"type": "dict", "properties": {}}),
    }} for f in functions]


def _schema(node: dict[str, Any]) -> dict[str, Any]:
    """A BFCL parameter schema in JSON-schema terms, converted at every depth (nested dicts, list items)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str):
            if value != "any":  # any JSON value: no type constraint at all
                out[key] = JSON_TYPES.get(value, value)
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: _schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _schema(value)
        else:
            out[key] = value
    return out


# ---------------------------------------------------------------- running and grading


async def run_bfcl_task(task: Task, llm: LLM, max_tokens: int | None = None) -> tuple[list[tuple[str, dict]], str]:
    """One model call on the task's first turn with its functions as tools: the calls in the reply as
    (tool name, arguments) in order, and the reply's text. Nothing is executed.

    The agent loop is not used: it adds its own system prompt and would run the calls through a toolbox,
    while BFCL's single-turn items are one request whose calls are graded as they are. Calls are read
    as the agent reads them (`dialects.parse_tool_call`): repaired JSON is accepted and null-valued
    arguments are dropped, where BFCL's own decoding would reject the one and grade the other."""
    from nanbeige.agent import dialects

    tools = tools_for(task.metadata["functions"])
    completion = await llm.complete(task.metadata["messages"], tools=tools, max_tokens=max_tokens,
                                    conversation=llm.new_conversation())
    # Calls come back as `tool_calls` when a server parses them, else as <tool_call> blocks in the text.
    offered = [{"server": SERVER, "name": t["function"]["name"]} for t in tools]
    parsed = dialects.parse_tool_call(completion.message, offered)
    calls = [(call.name, call.arguments) for call in parsed.tool_calls]
    return calls, completion.message.get("content") or ""


def grade(task: Task, tool_calls: list[tuple[str, dict]]) -> Verdict:
    """The calls of the first turn graded by BFCL's AST checker against the task's possible answers."""
    checker, language = _ast_checker()
    originals = name_map(task.metadata["functions"])
    # BFCL's model_output: one {function name: arguments} dict per call, in the order made.
    model_output = [{originals.get(name, name): dict(arguments)} for name, arguments in tool_calls]
    extracted = json.dumps(model_output, ensure_ascii=False, default=str)
    try:
        result = checker(task.metadata["functions"], model_output, task.metadata["ground_truth"],
                         language.PYTHON, task.metadata["category"], CHECKER_MODEL)
    except Exception as exc:  # the checker has no answer for some malformed outputs; BFCL's runner would crash
        return Verdict(correct=None, grader=GRADER, extracted=extracted,
                       error=f"the BFCL checker failed: {type(exc).__name__}: {exc}")
    reason = "" if result["valid"] else f"{result.get('error_type', '')}: {_error_text(result.get('error'))}"
    return Verdict(correct=bool(result["valid"]), grader=GRADER, extracted=extracted, reason=reason)


def _error_text(error: Any) -> str:
    """The checker's errors (strings, or dicts for each candidate call in parallel checks) as one line."""
    items = error if isinstance(error, list) else [error]
    return " ".join(item if isinstance(item, str) else json.dumps(item, ensure_ascii=False, default=str)
                    for item in items)


@functools.cache
def _ast_checker() -> tuple[Any, Any]:
    """The package's `ast_checker` function and its `Language` enum.

    The checker's file is run unchanged, as a private module, while a one-entry registry stands in for
    `bfcl_eval.constants.model_config`; the real registry is put back (or left absent) afterwards, so
    nothing else in the process sees the stand-in."""
    data = package_data()
    source = data.parent / "eval_checker" / "ast_eval" / "ast_checker.py"
    if not source.is_file():
        raise LoadError(f"{source}: missing; reinstall with {INSTALL}")
    from bfcl_eval.constants.enums import Language

    registry = types.ModuleType("bfcl_eval.constants.model_config")
    registry.MODEL_CONFIG_MAPPING = {CHECKER_MODEL: types.SimpleNamespace(underscore_to_dot=False)}  # type: ignore
    key = registry.__name__
    saved = sys.modules.get(key)
    sys.modules[key] = registry
    try:
        spec = importlib.util.spec_from_file_location("nanbeige_bfcl_ast_checker", source)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    finally:
        if saved is None:
            sys.modules.pop(key, None)
        else:
            sys.modules[key] = saved
    return module.ast_checker, Language
