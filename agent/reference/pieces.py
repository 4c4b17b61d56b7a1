"""The readers of `agent/reference/checkout.py`: each finds one text or rule the model reads in a checkout of
MiroThinker and says what it found, or raises ReferenceError naming what is missing. Those that run the
checkout's code are in `prompt_functions.py`; the rest, here, read the source without running it."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from nanbeige.agent.reference.prompt_functions import read_summary_prompt, read_system_prompt, read_user_message
from nanbeige.agent.reference.reader import FILES, Reader, ReferenceError

# The evaluator's judge prompts (module-level templates it fills with `.format(question=, correct_answer=,
# response=)`), by the name our judges share.
JUDGE_PROMPTS = {
    "browsecomp": "JUDGE_PROMPT_BC_en",
    "browsecomp-zh": "JUDGE_PROMPT_BC_zh",
    "hle": "HLE_JUDGE_PROMPT",
    "xbench": "JUDGE_PROMPT_XBENCH",
    "equivalent": "GAIA_VALIDATION_TEXT_103_SCORER_PROMPT",
}
# The keep-5 agent config: named `single_agent_keep5` at v1.0 and `mirothinker_v1.0_keep5` later.
AGENT_CONFIGS = (
    "apps/miroflow-agent/conf/agent/mirothinker_v1.0_keep5.yaml",
    "apps/miroflow-agent/conf/agent/single_agent_keep5.yaml",
)
ANSWER_GENERATOR = "apps/miroflow-agent/src/core/answer_generator.py"  # the summary's home in later layouts
TOOL_SERVERS = ("tool-python", "search_and_scrape_webpage", "jina_scrape_llm_summary")
# The duplicate-query note is the orchestrator's f-string whose fields are exactly these variables
# (its names for them, and ours).
_DUPLICATE_FIELDS = {"query_str": "query", "tool_name": "tool"}


# ---------------------------------------------------------------- the pieces


def _read_tags(reader: Reader) -> tuple[dict[str, Any], str]:
    values = {name: _literal(reader, FILES["prompts"], name) for name in ("mcp_tags", "refusal_keywords")}
    if not all(isinstance(v, list) and v and all(isinstance(s, str) for s in v) for v in values.values()):
        raise ReferenceError(f"{FILES['prompts']} has no lists mcp_tags and refusal_keywords")
    return (
        {"mcp_tags": tuple(values["mcp_tags"]), "refusals": tuple(values["refusal_keywords"])},
        f"{len(values['mcp_tags'])} malformed-call tags, {len(values['refusal_keywords'])} refusal phrases",
    )


def _read_duplicate_query(reader: Reader) -> tuple[dict[str, Any], str]:
    """The note a repeated query gets (v1.0), as a template; None when the orchestrator has none
    (from 2025-12-28 a repeat is rolled back)."""
    tree = reader.tree(FILES["orchestrator"])
    notes = {
        _fstring_template(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr) and _field_names(node) == set(_DUPLICATE_FIELDS)
    }
    if len(notes) > 1:
        raise ReferenceError(f"{FILES['orchestrator']} has {len(notes)} different duplicate-query notes")
    tools = _query_tools(tree)
    if notes:
        return (
            {"duplicate_query": notes.pop(), "query_tools": tools},
            f"a note answers a repeated query of {', '.join(tools) or 'no tool of ours'}",
        )
    return (
        {"duplicate_query": None, "query_tools": tools},
        "a repeated query is rolled back (no note in the orchestrator)",
    )


def _query_tools(tree: ast.Module) -> tuple[str, ...]:
    """Which of our tools the orchestrator's query-string function (`_get_query_str_from_tool_call`)
    compares `tool_name` with; the later layout has it in another file and rolls repeats back."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.endswith("get_query_str_from_tool_call"):
            names = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            return tuple(t for t in ("google_search", "scrape_and_extract_info") if t in names)
    return ("google_search", "scrape_and_extract_info")


def _field_names(node: ast.JoinedStr) -> set[str]:
    return {
        value.value.id if isinstance(value.value, ast.Name) else ""
        for value in node.values
        if isinstance(value, ast.FormattedValue)
    }


def _read_summary_tries(reader: Reader) -> tuple[dict[str, Any], str]:
    """The number of summary tries, from the assignment to `...final_answer_retries` (in the
    orchestrator, or in the answer generator of later layouts): a number, or `A if ... keep_tool_result
    == -1 else B`. None at all (v1.0): one try."""
    for relative in (FILES["orchestrator"], ANSWER_GENERATOR):
        if relative != FILES["orchestrator"] and not reader.exists(relative):
            continue
        tree = reader.tree(relative)
        constants = {
            t.id: n.value.value
            for n in tree.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
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

    if (
        isinstance(value, ast.IfExp)
        and "keep_tool_result" in ast.unparse(value.test)
        and "-1" in ast.unparse(value.test)
    ):
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
            texts |= {
                _fstring_template(n.value, {"sandbox_id": "sandbox_id"})
                for n in node.body
                if isinstance(n, ast.Return) and isinstance(n.value, ast.JoinedStr)
            }
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
        elif (
            isinstance(value, ast.FormattedValue)
            and isinstance(value.value, ast.Name)
            and value.value.id in fields
            and value.conversion == -1
            and value.format_spec is None
        ):
            parts.append("{" + fields[value.value.id] + "}")
        else:
            raise ReferenceError("an f-string of the reference has a field this version does not know")
    return "".join(parts)


def _read_tool_descriptions(reader: Reader) -> tuple[dict[str, Any], str]:
    descriptions = {}
    for server in TOOL_SERVERS:
        for name, doc in _tool_docstrings(reader, FILES[server]).items():
            descriptions[(server, name)] = doc
    for needed in (
        ("tool-python", "run_python_code"),
        ("search_and_scrape_webpage", "google_search"),
        ("jina_scrape_llm_summary", "scrape_and_extract_info"),
    ):
        if needed not in descriptions:
            raise ReferenceError(f"{FILES[needed[0]]} has no tool {needed[1]} with a docstring")
    return {"tool_descriptions": descriptions}, f"{len(descriptions)} tools"


def _tool_docstrings(reader: Reader, relative: str) -> dict[str, str]:
    """The docstrings of the functions registered with `@<server>.tool()`, as `__doc__` holds them on
    the Python the reference ran on (MCP SDK 1.x takes a tool's description from `__doc__`): raw on
    3.12, as 3.13's compiler cleans them with `reader.python` "3.13"."""
    docs = {}
    for node in reader.tree(relative).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
            _is_tool_decorator(d) for d in node.decorator_list
        ):
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
    return "\n".join(
        [lines[0].lstrip(" ")] + [line[min(margin, len(line) - len(line.lstrip(" "))) :] for line in lines[1:]]
    )


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
        settings |= {
            k: data[k]
            for k in (
                "temperature",
                "top_p",
                "max_tokens",
                "max_context_length",
                "repetition_penalty",
                "keep_tool_result",
            )
            if k in data
        }
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
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr == "strip"
                and not value.args
                and not value.keywords
            ):
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
    ("system prompt", read_system_prompt),
    ("summary prompt", read_summary_prompt),
    ("malformed-call tags and refusals", _read_tags),
    ("user message", read_user_message),
    ("duplicate-query rule", _read_duplicate_query),
    ("summary tries", _read_summary_tries),
    ("tool descriptions", _read_tool_descriptions),
    ("page-extraction prompt", _read_extraction_prompt),
    ("placeholder sandbox ids", _read_placeholder_ids),
    ("keep-5 agent settings", _read_settings),
    ("judge prompts", _read_judge_prompts),
]
