"""BFCL-V4 through its own pipeline: the `bfcl-eval` package's model handler formats every prompt and
decodes every reply, and its evaluation runner grades the result files and computes the summary
numbers. Nothing of ours sits between the model's text and the official verdict; what is ours is how the
model is reached (a server or the model in this process), concurrency, resume, progress and the report.

    pip install --no-deps bfcl-eval==2026.3.23   # its own dependencies pin every vendor SDK
    pip install -e ".[bfcl]"                      # what its handler and runner import besides

The package's model registry (`bfcl_eval.constants.model_config`) imports every vendor SDK to list every
model. The runner and the response generator only look one entry up in it, so `official()` puts a
registry holding that one entry in its place, with the entry's fields read from the package's own
registry source (`registry_entry`): the handler class, `is_fc_model`, `underscore_to_dot`, the display
name are the package's, not ours.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import os
import sys
import threading
import types
from pathlib import Path
from typing import Any, Callable

from nanbeige.evals.eval_config import EvalError
from nanbeige.evals.tasks import LoadError, Task
from nanbeige.tools import handed_over

PACKAGE = "bfcl-eval==2026.3.23"
INSTALL = f"pip install --no-deps {PACKAGE} && pip install 'nanbeige[bfcl]'"
HANDLER_ENTRY = "Nanbeige/Nanbeige4-3B-Thinking-2511"
"""The registry entry whose handler formats and decodes: the package's entry for this model family
(`NanbeigeFCHandler`, function-calling mode, names kept dotted)."""
TEMPERATURE = 0.001
"""The official generator's default temperature (`bfcl generate --temperature`)."""
GRADER = "bfcl-eval"

# BFCL's own category names (`bfcl_eval.constants.category_mapping`), checked against the installed
# package when loaded. memory_vector downloads an embedding model, and format sensitivity is not run for
# function-calling models. Web search runs on our search backend in place of the official engine (SerpAPI's
# DuckDuckGo), so its number is not the official one: it is asked for by name, never part of `all`.
RUNNABLE = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_irrelevance",
    "live_relevance",
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
    "memory_kv",
    "memory_rec_sum",
)
WEB_SEARCH = ("web_search_base", "web_search_no_snippet")
NOT_RUNNABLE = {
    "memory_vector": "needs a sentence-transformers embedding model downloaded at run time",
    "format_sensitivity": "is not run for function-calling models (the official generator skips it)",
}
GROUPS = {
    "non_live": RUNNABLE[:7],
    "live": RUNNABLE[7:13],
    "single_turn": RUNNABLE[:13],
    "multi_turn": RUNNABLE[13:17],
    "memory": RUNNABLE[17:],
    "web_search": WEB_SEARCH,
    "all": RUNNABLE,
}
"""Our names for sets of categories (`bfcl-<group>`); `all` is every category that runs here."""


# ---------------------------------------------------------------- the package, with a one-entry registry


def package_root() -> Path:
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise LoadError(f"BFCL needs the bfcl-eval package: {INSTALL}")
    return Path(spec.submodule_search_locations[0])


def registry_entry(name: str, source: Path) -> dict[str, Any]:
    """The fields of registry entry `name` as the package's registry source writes them; the handler is
    the class of that name, imported from the module the registry imports it from."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    modules = {
        alias.asname or alias.name: node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values):
            if isinstance(key, ast.Constant) and key.value == name and isinstance(value, ast.Call):
                fields = {kw.arg: kw.value for kw in value.keywords}
                handler = fields.pop("model_handler")
                entry = {arg: ast.literal_eval(node) for arg, node in fields.items()}
                module = importlib.import_module(modules[handler.id])  # type: ignore[attr-defined]
                return entry | {"model_handler": getattr(module, handler.id)}  # type: ignore[attr-defined]
    raise LoadError(f"{source}: no registry entry {name!r}; this needs {PACKAGE}")


class SearchEngine:
    """What the package's web search backend imports as `serpapi.GoogleSearch`: our search answers its
    queries (`use_search`), in SerpAPI's result shape, so that everything around the call (the result
    format, `show_snippet`, the error texts) stays the package's. Its region is not passed on: our
    backends take none."""

    search: Callable[[str, int], list[dict[str, str]]] | None = None
    """(keywords, how many) -> results with title, link and snippet; set for the run by `use_search`."""

    def __init__(self, params: dict[str, Any]):
        self.params = params

    def get_dict(self) -> dict[str, Any]:
        if SearchEngine.search is None:
            return {"error": "no search backend was set up for this run"}
        return {"organic_results": SearchEngine.search(self.params["q"], 10)}


def official_search() -> bool:
    """Whether web search runs on the official engine: SerpAPI's client installed and its key set."""
    return bool(os.environ.get("SERPAPI_API_KEY")) and importlib.util.find_spec("serpapi") is not None


def use_search(search: Callable[[str, int], list[dict[str, str]]] | None) -> None:
    """Answer the web search categories' queries with `search` (None: no search)."""
    SearchEngine.search = search


@functools.cache
def official() -> types.SimpleNamespace:
    """The package's modules this pipeline uses, imported once with the one-entry registry in place."""
    root = package_root()
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path.home() / ".cache" / "nanbeige" / "bfcl"))
    try:
        entry = registry_entry(HANDLER_ENTRY, root / "constants" / "model_config.py")
        registry = types.ModuleType("bfcl_eval.constants.model_config")
        registry.MODEL_CONFIG_MAPPING = {HANDLER_ENTRY: types.SimpleNamespace(**entry)}  # type: ignore[attr-defined]
        sys.modules[registry.__name__] = registry
        if not official_search():  # the official engine's client, or ours in its place (SearchEngine)
            engine = types.ModuleType("serpapi")
            engine.GoogleSearch = SearchEngine  # type: ignore[attr-defined]
            sys.modules["serpapi"] = engine
        modules = {
            name: importlib.import_module(f"bfcl_eval.{name}")
            for name in (
                "utils",
                "constants.category_mapping",
                "constants.enums",
                "eval_checker.eval_runner",
                "eval_checker.eval_runner_helper",
                "_llm_response_generation",
            )
        }
    except ImportError as exc:
        raise LoadError(f"BFCL's pipeline cannot be imported ({exc}): {INSTALL}") from None
    # The runner's summary table loads every category it did not grade, whole, to count its items: about a
    # second and a half on each grading, the same each time. Its helper module uses what it loads only for
    # `len()`, so those loads are kept for the process; the counts, and so every number, are unchanged.
    helper = modules["eval_checker.eval_runner_helper"]
    helper.load_dataset_entry = functools.cache(helper.load_dataset_entry)  # once: official() is cached itself
    return types.SimpleNamespace(
        entry=entry,
        utils=modules["utils"],
        runner=modules["eval_checker.eval_runner"],
        categories=modules["constants.category_mapping"],
        generation=modules["_llm_response_generation"],
    )


# ---------------------------------------------------------------- categories and items


def categories_of(name: str) -> tuple[str, ...]:
    """The official categories a benchmark name (`all`, a group, or a category) stands for."""
    if name in GROUPS:
        return GROUPS[name]
    if name in NOT_RUNNABLE:
        raise LoadError(f"BFCL's {name} cannot be run here: it {NOT_RUNNABLE[name]}")
    if name not in RUNNABLE + WEB_SEARCH:
        raise LoadError(
            f"unknown BFCL category {name!r}; known: {', '.join(RUNNABLE + WEB_SEARCH)}, and the "
            f"groups {', '.join(GROUPS)}"
        )
    return (name,)


def load(name: str) -> list[Task]:
    """The items of the categories `name` stands for, as the official generator loads them (function
    docs with their language hints, multi-turn classes and initial state; a memory category's
    prerequisite conversations first, each depending on those before it, and its questions on all)."""
    package = official()
    known = set(package.categories.ALL_CATEGORIES)
    tasks = []
    for category in categories_of(name):
        if category not in known:
            raise LoadError(f"{PACKAGE} has no category {category!r}")
        for entry in package.utils.load_dataset_entry(category):
            first = entry["question"][0] if entry.get("question") else []
            text = "\n\n".join(m.get("content") or "" for m in first if m.get("role") == "user")
            tasks.append(
                Task(
                    id=entry["id"],
                    question=text,
                    answer="",
                    level=category,
                    metadata={"category": category, "entry": entry},
                )
            )
    return tasks


# ---------------------------------------------------------------- the handler, talking to our backend


class Completions:
    """What the handler calls as `client.completions.create(...)`: a text completion from our backend.
    `complete(prompt, max_tokens, temperature)` gives (text, prompt tokens, completion tokens); the
    calls made are kept (`calls`) for the item's trajectory, and a failure of the backend itself
    (`failure`) marks the item as not done, rather than as the model's wrong answer; a prompt the server
    refuses as too long is the item's own outcome, recorded as the official generator records errors."""

    def __init__(self, complete: Callable[[str, int, float], tuple[str, int, int]]):
        self.complete = complete
        self.calls: list[dict[str, Any]] = []
        self.failure: str | None = None

    def create(self, *, prompt: str, max_tokens: int, temperature: float, **_: Any) -> Any:
        from nanbeige.agent.backends.llm import ContextOverflow

        try:
            text, prompt_tokens, completion_tokens = self.complete(prompt, max_tokens, temperature)
        except ContextOverflow:  # the item's own prompt is too long: the official generator records that
            raise
        except Exception as exc:
            self.failure = self.failure or f"{type(exc).__name__}: {exc}"
            raise
        self.calls.append(
            {
                "prompt": prompt,
                "text": text,
                "max_tokens": max_tokens,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
            }
        )
        return types.SimpleNamespace(
            choices=[types.SimpleNamespace(text=text)],
            usage=types.SimpleNamespace(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens),
        )


class PerItem(threading.local):
    """The handler's `client`: one handler serves every item, each item runs in a worker thread of its
    own, and `completions` is that thread's item's `Completions`."""

    completions: Completions | None = None


def handler_for(tokenizer: Any, max_context_length: int, model: str, temperature: float) -> Any:
    """The registry entry's handler, built as the official generator builds it, its model calls going to
    the `Completions` of the item its thread runs (`infer`), with `tokenizer` (anything with
    `.tokenize(text)`) for its prompt-size arithmetic."""
    entry = official().entry
    handler = entry["model_handler"](
        model_name=entry["model_name"],
        temperature=temperature,
        registry_name=HANDLER_ENTRY,
        is_fc_model=entry["is_fc_model"],
    )
    handler.client = PerItem()
    handler.tokenizer, handler.max_context_length, handler.model_path_or_id = tokenizer, max_context_length, model
    return handler


def infer(handler: Any, entry: dict[str, Any], completions: Completions) -> dict[str, Any]:
    """One item through the official generator's per-item function, in this thread, its model calls
    answered by `completions`: the result line it writes (an error raised inside the handler is recorded
    as the official generator records it)."""
    fresh_state(entry["id"])
    handler.client.completions = completions
    try:
        return official().generation.multi_threaded_inference(handler, entry, True, False)
    finally:
        handler.client.completions = None


def fresh_state(item_id: str | None = None) -> None:
    """Forget the multi-turn backends' instances (of one item, or all). The package keeps each item's
    simulated file system, bank account, ... as a module global named after the model and the item, and
    reuses it when the name is taken: right within one process per run, as the official scripts run,
    but a second run of an item in the same process (a retry, a re-grade) must start from the item's
    initial state again."""
    import re

    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    marker = "_" + re.sub(r"[-./:]", "_", item_id) + "_" if item_id else ""
    for name in [n for n in vars(multi_turn_utils) if n.endswith("_instance") and marker in n]:
        del vars(multi_turn_utils)[name]


def result_dir(out: Path) -> Path:
    return out / "bfcl" / "result"


def score_dir(out: Path) -> Path:
    return out / "bfcl" / "score"


def model_dir() -> str:
    return HANDLER_ENTRY.replace("/", "_")


MAX_OUT_FILE_BYTES = 1024 * handed_over.MIB
"""The largest result or score file of an out folder: an item's result line is at most a few megabytes."""


def read_out_file(path: Path, out: Path, max_bytes: int = MAX_OUT_FILE_BYTES) -> bytes:
    """A file of the out folder `out` (result, score, summary, memory snapshot), read as handed over: the folder
    may be one someone else made (`eval report`, a resumed eval), so a link, a FIFO or a file past `max_bytes`
    is one line (EvalError), not a file read from elsewhere, a hang or a MemoryError."""
    try:
        return handed_over.read_bytes(path, max_bytes, inside=out)
    except handed_over.HandedOverError as exc:
        raise EvalError(f"{exc}; pass another out folder") from None
    except OSError as exc:
        raise EvalError(f"cannot read {path}: {exc.strerror or exc}; pass another out folder") from None


def done_ids(out: Path) -> set[str]:
    """The items whose result lines are already in the result files (torn lines skipped)."""
    import json

    folder = result_dir(out) / model_dir()
    ids = set()
    for path in folder.rglob("*_result.json") if folder.exists() else []:
        for line in read_out_file(path, out).splitlines():
            try:
                ids.add(json.loads(line)["id"])
            except (ValueError, KeyError, TypeError):
                continue
    return ids


def write(handler: Any, result: dict[str, Any], out: Path) -> None:
    handler.write(result, result_dir=result_dir(out))
