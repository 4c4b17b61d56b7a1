"""The parts of BFCL's pipeline that run model text as Python, run inside a sandbox (`bfcl_jail.py` on the
host writes this file there as `bfcl_inside.py`). Standard library and the bfcl-eval package only: it runs in
the sandbox's interpreter, which sees the package read-only and nothing of nanbeige.

The package's multi-turn backends `eval()` each call the model makes, built from the model's text
(`execute_multi_turn_func_call`), while an item is generated and again while it is graded. Both happen here,
in the package's own code, unchanged:

- one item of a multi-turn or agentic category (`start`, then `step` per question): the official per-item
  function runs in a thread of the sandbox's Python process (which runs the items of its batch one after
  another, each from a fresh state, as the official generator runs them all in one process). What it needs
  from outside (a completion, a prompt's token count, a web search, a page) it asks the host: the question is
  written to `exchange/question.json` and the cell returns; the host's answer comes in
  `exchange/answer.json` with the next cell. An item's
  memory snapshots come in and go out as files of the `start` request and of the last question.
- `python bfcl_inside.py grade`: the official runner over `result/`, writing `score/` and `runner.log`, and
  `graded.json` naming the score files it wrote.

Setting up is what `bfcl.official()` does on the host: a registry holding the one entry (its fields sent by
the host, read from the package's registry source), a search engine client that asks the host, and the
web search backend's page fetch (`fetch_url_content`) asking the host too.
"""

import contextlib
import importlib
import json
import os
import queue
import shutil
import sys
import threading
import types
from pathlib import Path

HOME = Path.cwd()
EXCHANGE = HOME / "exchange"
RESULT = HOME / "result"


class Host:
    """The item thread's line to the host: a question out, and it waits for the answer the next cell brings."""

    questions: "queue.Queue[dict]" = queue.Queue()
    answers: "queue.Queue[dict]" = queue.Queue()

    @classmethod
    def ask(cls, question):
        cls.questions.put(question)
        return cls.answers.get()


class Completions:
    """`client.completions.create`, answered by the host's model backend; the backend's error is raised
    here with the same text, for the official generator to record as it records errors."""

    def create(self, *, prompt, max_tokens, temperature, **_):
        answer = Host.ask({"complete": {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature}})
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return types.SimpleNamespace(
            choices=[types.SimpleNamespace(text=answer["text"])],
            usage=types.SimpleNamespace(
                prompt_tokens=answer["prompt_tokens"], completion_tokens=answer["completion_tokens"]
            ),
        )


class Tokenizer:
    """What the handler counts prompt tokens with: the host's tokenizer."""

    def tokenize(self, text):
        return [0] * Host.ask({"tokenize": text})["count"]


class GoogleSearch:
    """The package's search engine client (`serpapi.GoogleSearch`): the host runs the query."""

    def __init__(self, params):
        self.params = params

    def get_dict(self):
        answer = Host.ask({"search": self.params})
        if "error" in answer:  # our search backend is unavailable: raised into the package's code, as on the host
            raise RuntimeError(answer["error"])
        return answer["result"]


def fetch_url_content(self, url, mode="raw"):
    """The package's `WebSearchAPI.fetch_url_content` (same signature): the sandbox has no network, so the
    host fetches the page with the package's own method and sends its result; what that method raised
    before fetching is raised here with the same text."""
    question = json.dumps({"fetch": {"url": url, "mode": mode}})  # a value that is not JSON: raised here
    answer = Host.ask(json.loads(question))
    if "raise" in answer:
        raise ValueError(answer["raise"])
    return answer["result"]


def setup(settings):
    """The package imported as `bfcl.official()` imports it on the host; returns the handler's class."""
    os.environ["BFCL_PROJECT_ROOT"] = str(HOME / "project")
    handler_class = getattr(importlib.import_module(settings["handler_module"]), settings["handler_class"])
    registry = types.ModuleType("bfcl_eval.constants.model_config")
    registry.MODEL_CONFIG_MAPPING = {
        settings["name"]: types.SimpleNamespace(**settings["entry"], model_handler=handler_class)
    }
    sys.modules[registry.__name__] = registry
    engine = types.ModuleType("serpapi")
    engine.GoogleSearch = GoogleSearch
    sys.modules["serpapi"] = engine
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code import web_search

    web_search.WebSearchAPI.fetch_url_content = fetch_url_content
    return handler_class


def with_paths(value):
    """A JSON object `{"__path__": "x"}` (a path the host's entry held, under its result folder) as that
    path under this sandbox's result folder."""
    return RESULT / value["__path__"] if set(value) == {"__path__"} else value


def snapshot_files():
    """The memory snapshots under the result folder: what memory items read and write."""
    return {
        str(p.relative_to(RESULT)): p.read_text()
        for p in RESULT.rglob("*")
        if p.is_file() and "memory_snapshot" in p.relative_to(RESULT).parts
    }


# ---------------------------------------------------------------- one item


def start():
    """Starts the item of `exchange/start.json` and returns once it asks its first question (or is done)."""
    request = json.loads((EXCHANGE / "start.json").read_text(), object_hook=with_paths)
    forget_items()
    for name, text in request["files"].items():
        (RESULT / name).parent.mkdir(parents=True, exist_ok=True)
        (RESULT / name).write_text(text)
    handler_class = setup(request["settings"])
    handler = handler_class(
        model_name=request["settings"]["entry"]["model_name"],
        temperature=request["temperature"],
        registry_name=request["settings"]["name"],
        is_fc_model=request["settings"]["entry"]["is_fc_model"],
    )
    handler.client = types.SimpleNamespace(completions=Completions())
    handler.tokenizer, handler.max_context_length = Tokenizer(), request["max_context_length"]
    handler.model_path_or_id = request["model"]
    threading.Thread(target=run_item, args=(handler, request["entry"]), daemon=True).start()
    next_question()


def forget_items():
    """What the items run before in this process left: the multi-turn backends' instances (the package keeps
    them as module globals named after the item, as `bfcl.fresh_state` says) and the memory snapshots, which the
    host sends afresh with each item."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    for name in [n for n in vars(multi_turn_utils) if n.endswith("_instance")]:
        del vars(multi_turn_utils)[name]
    shutil.rmtree(RESULT, ignore_errors=True)
    Host.questions, Host.answers = queue.Queue(), queue.Queue()


def run_item(handler, entry):
    from bfcl_eval._llm_response_generation import multi_threaded_inference
    from bfcl_eval.utils import make_json_serializable

    try:
        result = multi_threaded_inference(handler, entry, True, False)
    except BaseException as exc:  # noqa: BLE001 - the model's code may raise SystemExit, which upstream lets through
        result = {"id": entry["id"], "result": f"Error during inference: {exc}"}
    Host.questions.put({"done": make_json_serializable(result), "files": snapshot_files()})


def step():
    """Hands the host's answer to the item and returns once it asks its next question (or is done)."""
    Host.answers.put(json.loads((EXCHANGE / "answer.json").read_text()))
    next_question()


def next_question():
    question = Host.questions.get()
    with open(EXCHANGE / "question.json", "w", encoding="utf-8") as stream:
        json.dump(question, stream)


# ---------------------------------------------------------------- grading


def grade():
    """The official runner over `result/` as `grade.json` says; its output goes to `runner.log`."""
    request = json.loads((HOME / "grade.json").read_text())
    setup(request["settings"])
    error = None
    with open(HOME / "runner.log", "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        from bfcl_eval.eval_checker.eval_runner import runner

        try:
            runner(request["models"], request["categories"], RESULT, HOME / "score", allow_missing=request["partial"])
        except Exception as exc:  # the runner's own failure (its summary table needs 2 items or more)
            error = f"{type(exc).__name__}: {exc}"
    files = [str(p.relative_to(HOME / "score")) for p in (HOME / "score").rglob("*") if p.is_file()]
    (HOME / "graded.json").write_text(json.dumps({"files": files, "error": error}))


if __name__ == "__main__" and sys.argv[1:] == ["grade"]:
    grade()
