"""Where BFCL's pipeline runs model text as Python: in a sandbox of the local backend, in its jail, never in
nanbeige's process.

BFCL's multi-turn backends build each call the model makes into a string, `ls(a=1, b=2)`, and `eval()` it
(the package's `execute_multi_turn_func_call`); a model whose argument name is `a=__import__('os')...,b` runs
what it likes there. That happens while a multi-turn or agentic (memory, web search) item is generated, and
again while a multi-turn category is graded, also by `nanbeige eval report` on a folder someone handed over.
So those items, and that grading, run the package's own code in a sandbox (`bfcl_inside.py` there): the
package read-only, no network, its own uid, seccomp. The verdicts are the official code's on the same outputs;
what the sandbox sends back (an item's result line, memory snapshots, score files) is read as data, and its
questions are answered only where the package's own code could have asked them (`bfcl_exchange.py`). Grading
gets only replies whose calls run nothing but the package's functions (`graded_copy`): the runner checks in the
process that runs them.

Cost: one sandbox per concurrent item, each running items one after another in one Python process (the
package imported once: about 2 s of CPU), one cell per model call, prompt count, search or page; one per
grading. Items that share a sandbox share a process, as all items share the official generator's: a model's code
can reach the items of its own sandbox, nothing outside.

Where no jail can be made the sandbox refuses (`require_jail`), unless the operator turned the jail off
(NANBEIGE_SANDBOX_JAIL=0): then these run in the sandbox's weaker isolation.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import contextlib
import json
import os
import threading
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from nanbeige.evals import bfcl, files
from nanbeige.evals.eval_config import EvalError
from nanbeige.tools.sandbox import SandboxConfig, SandboxError, config_from_env

if TYPE_CHECKING:
    from nanbeige.evals.bfcl_exchange import ItemHost

INSIDE = Path(__file__).with_name("bfcl_inside.py")
HOME = PurePosixPath("/home/user")
MAX_EXCHANGE_BYTES = 64 << 20
"""The largest question or result line the sandbox may send back (a result line holds every prompt)."""
MAX_SCORE_BYTES = 256 << 20
GRADE_TIMEOUT_S = 6 * 3600.0
"""The official runner over every multi-turn item takes minutes; a sandbox that runs for hours is stuck."""


class JailError(Exception):
    """Model text cannot be run here as it must be: in the jail (or, by the operator's choice, the sandbox)."""


def package_settings() -> dict[str, Any]:
    """What the sandbox needs to set the package up as `bfcl.official()` did here: the registry entry's fields
    and where its handler class lives."""
    entry = bfcl.official().entry
    handler = entry["model_handler"]
    return {
        "name": bfcl.HANDLER_ENTRY,
        "handler_module": handler.__module__,
        "handler_class": handler.__name__,
        "entry": {k: v for k, v in entry.items() if k != "model_handler"},
    }


def runs_model_text(category: str) -> bool:
    """Whether the official generator executes the model's calls for this category (multi-turn and agentic)."""
    return bool(bfcl.official().utils.contain_multi_turn_interaction(category))


def graded_by_execution(category: str) -> bool:
    """Whether the official runner executes the model's calls to grade this category (multi-turn)."""
    return bool(bfcl.official().utils.is_multi_turn(category))


class Jail:
    """The sandboxes of one eval (or one re-grading); thread-safe; `close()` when done."""

    def __init__(self, config: SandboxConfig | None = None, hidden: tuple[str, ...] = ()) -> None:
        """`hidden`: folders the sandboxes show empty (`answer_folders`)."""
        from nanbeige.tools.sandbox.local import LocalBackend

        self.config = replace(config or config_from_env(), backend="local", hidden=hidden)
        self.backend = LocalBackend(self.config)
        self.lock = threading.Lock()
        self.idle: list[str] = []
        """Sandboxes whose item ended, for the next."""

    def require_jail(self) -> None:
        """JailError (one line) unless sandboxes here are jailed, or the operator turned the jail off."""
        try:
            jailed = self.backend.isolation.jail is not None
        except SandboxError as exc:
            raise JailError(f"BFCL runs the model's calls as Python only in the sandbox: {exc}") from None
        if not jailed and self.config.jail:
            raise JailError(
                "BFCL's multi-turn and agentic items run the model's calls as Python, only in the "
                "sandbox's jail, and bwrap is missing or cannot make one here: install bubblewrap (apt-get "
                "install bubblewrap), or set NANBEIGE_SANDBOX_JAIL=0 to run them with the sandbox's weaker "
                "isolation"
            )

    def close(self) -> None:
        self.backend.close()

    # ------------------------------------------------------------ one item

    def infer(
        self,
        entry: dict[str, Any],
        result_dir: Path,
        ask: ItemHost,
        run: dict[str, Any],
    ) -> dict[str, Any]:
        """One item through the official per-item function in a sandbox: its result line. `ask` answers the item's
        questions (a completion, a token count, a search, a page) and checks its result line (`bfcl_exchange`);
        `run` holds the handler's temperature, model and context length. A sandbox that cannot be made or
        started raises SandboxError (this machine's failure); an item whose sandbox breaks afterwards (the
        model's code may do that) gets an error line, as the official generator records an item that raised,
        and its sandbox goes. A sandbox whose item ended runs the next item (the package imported once per
        sandbox, not once per item)."""
        sandbox, warm = self.take()
        kept = False
        try:
            files = snapshots(result_dir / bfcl.model_dir(), result_dir)
            start = {"settings": package_settings(), "entry": entry, "files": files, **run}
            if not warm:
                self.backend.write_file(sandbox, str(HOME / "bfcl_inside.py"), INSIDE.read_bytes())
            self.backend.write_file(
                sandbox,
                str(HOME / "exchange" / "start.json"),
                json.dumps(start, default=lambda p: relative_path(p, result_dir)).encode(),
            )
            self.cell(sandbox, "import sys\nsys.path.insert(0, '')\nimport bfcl_inside\nbfcl_inside.start()")
            try:
                result = self.converse(sandbox, entry["id"], ask, result_dir, files)
            except SandboxError as exc:  # the item's own sandbox broke: the model's code did that, or its time ran out
                return {"id": entry["id"], "result": f"Error during inference: the item's sandbox stopped: {exc}"}
            kept = True
            return result
        finally:
            if kept:
                with self.lock:
                    self.idle.append(sandbox)
            else:
                self.backend.destroy(sandbox)

    def take(self) -> tuple[str, bool]:
        """A sandbox for an item: one whose item ended (True), else a new one."""
        with self.lock:
            if self.idle:
                return self.idle.pop(), True
        return self.backend.create(int(self.config.idle_timeout_s)), False

    def converse(
        self,
        sandbox: str,
        item_id: str,
        ask: ItemHost,
        result_dir: Path,
        files: dict[str, str],
    ) -> dict[str, Any]:
        """Answers the item's questions until it is done; its result line, its new memory snapshots written."""
        while True:
            question = self.read_json(sandbox, HOME / "exchange" / "question.json")
            if "done" in question:
                result = question["done"]
                if not isinstance(result, dict) or result.get("id") != item_id:
                    raise SandboxError("the sandbox sent a result line of another item")
                write_snapshots(question.get("files"), files, result_dir)
                return ask.result(result)
            answer = ask(question)
            self.backend.write_file(sandbox, str(HOME / "exchange" / "answer.json"), json.dumps(answer).encode())
            self.cell(sandbox, "bfcl_inside.step()")

    def cell(self, sandbox: str, code: str) -> None:
        """Runs a cell of ours; SandboxError when it raised (the item's code may have broken the process)."""
        shown = self.backend.run_python(sandbox, code)
        if not shown.endswith("Error: None)"):
            raise SandboxError(f"the sandbox's Python process failed: {shown[-300:]}")

    def read_json(self, sandbox: str, path: PurePosixPath) -> dict[str, Any]:
        try:
            value = json.loads(self.backend.read_file(sandbox, str(path), MAX_EXCHANGE_BYTES))
        except (ValueError, RecursionError):
            value = None
        if not isinstance(value, dict):
            raise SandboxError(f"the sandbox sent something other than a JSON object in {path.name}")
        return value

    # ------------------------------------------------------------ grading

    def grade(self, result_dir: Path, score_dir: Path, categories: list[str], partial: bool, log: Path) -> str | None:
        """The official runner over the result files of `categories` in a sandbox; writes its score files and its
        output (`log`); returns the runner's own failure, None when it had none."""
        sandbox = self.backend.create(int(self.config.idle_timeout_s))
        try:
            self.backend.write_file(sandbox, str(HOME / "bfcl_inside.py"), INSIDE.read_bytes())
            request = {
                "settings": package_settings(),
                "models": [bfcl.model_dir()],
                "categories": categories,
                "partial": partial,
            }
            self.backend.write_file(sandbox, str(HOME / "grade.json"), json.dumps(request).encode())
            handler = bfcl.handler_for(None, 0, "", bfcl.TEMPERATURE)  # decodes replies as the runner will
            for path in result_dir.rglob("*_result.json"):
                self.backend.write_file(
                    sandbox,
                    str(HOME / "result" / path.relative_to(result_dir).as_posix()),
                    graded_copy(bfcl.read_out_file(path, result_dir), handler),
                )
            run = self.backend.run_program(
                sandbox,
                [self.config.python, "-I", "-B", "bfcl_inside.py", "grade"],
                timeout_s=GRADE_TIMEOUT_S,
                cpu_seconds=int(GRADE_TIMEOUT_S),
            )
            log.write_bytes(
                self.backend.read_file(sandbox, str(HOME / "runner.log"), MAX_SCORE_BYTES)
                if run.exit_code == 0
                else run.stderr
            )
            if run.exit_code != 0:
                raise SandboxError(
                    f"BFCL's runner stopped in the sandbox (exit {run.exit_code}): "
                    f"{run.stderr.decode(errors='replace').strip()[-300:]}"
                )
            graded = self.read_json(sandbox, HOME / "graded.json")
            for name in graded.get("files") or []:
                write_inside(
                    score_dir,
                    safe_name(name, (".json", ".csv")),
                    self.backend.read_file(sandbox, str(HOME / "score" / name), MAX_SCORE_BYTES),
                )
            return graded.get("error") if isinstance(graded.get("error"), str) else None
        finally:
            self.backend.destroy(sandbox)


@contextlib.asynccontextmanager
async def sandboxes(needed: bool) -> Any:
    """The sandboxes of an eval's items, where some item needs them; EvalError (one line) where they cannot be
    jailed here and the operator did not turn the jail off: then no item runs."""
    if not needed:
        yield None
        return
    jail = Jail(hidden=answer_folders())
    try:
        await asyncio.to_thread(require_jail, jail)
        yield jail
    finally:
        await asyncio.to_thread(jail.close)


def answer_folders() -> tuple[str, ...]:
    """The package's answers (`data/possible_answer`), which generating an item never reads: hidden from the
    items' sandboxes, so that the model's code there cannot read them to feed its model (grading reads them)."""
    folder = bfcl.package_root() / "data" / "possible_answer"
    return tuple(dict.fromkeys((str(folder), os.path.realpath(folder))))


def require_jail(jail: Jail) -> None:
    try:
        jail.require_jail()
    except JailError as exc:
        raise EvalError(str(exc)) from None


def grade_in_sandbox(out: Path, categories: list[str], partial: bool, log: Path) -> str | None:
    """The official runner in a sandbox: the runner's own failure, or None; EvalError when the sandbox cannot be
    made or the runner did not finish there."""
    jail = Jail()
    try:
        require_jail(jail)
        return jail.grade(bfcl.result_dir(out), bfcl.score_dir(out), categories, partial, log)
    except SandboxError as exc:
        raise EvalError(f"BFCL's grading failed in the sandbox: {exc}") from None
    finally:
        jail.close()


NOT_RUN = "(not run when graded: a call in this reply would run more than the package's own functions)"


def graded_copy(data: bytes, handler: Any) -> bytes:
    """A result file as the grading sandbox gets it. The runner `eval()`s the calls of multi-turn replies in the
    process that checks them, where code in a call could change the verdicts of every item graded after it; so
    a reply with a call that would run anything but a method of the package's backends, with literal arguments
    (`runs_only_the_package`), goes as NOT_RUN, which the runner skips as it skips any reply without calls.
    A model that calls its functions never writes such a reply: its verdicts are the runner's own."""
    lines = []
    for raw in data.splitlines():
        try:
            line = json.loads(raw)
            category = bfcl.official().utils.extract_test_category_from_id(line["id"])
        except (ValueError, RecursionError, TypeError, KeyError):
            lines.append(raw)  # the runner's to refuse
            continue
        if graded_by_execution(category) and isinstance(line.get("result"), list):
            turns = [[plain_reply(s, handler) for s in t] if isinstance(t, list) else t for t in line["result"]]
            raw = json.dumps(line | {"result": turns}).encode()
        lines.append(raw)
    return b"".join(line + b"\n" for line in lines)


def plain_reply(reply: Any, handler: Any) -> Any:
    """The reply, or NOT_RUN where one of its calls, as the handler decodes them, would run anything else."""
    try:
        calls = handler.decode_execute(reply, has_tool_call_tag=False)
    except Exception:  # noqa: BLE001 - the runner cannot decode it either, and runs nothing of it
        return reply
    if isinstance(calls, list) and all(isinstance(c, str) and runs_only_the_package(c) for c in calls):
        return reply
    return NOT_RUN


def runs_only_the_package(call: str) -> bool:
    """Whether the package's `eval()` of `call` runs a method of its backends and nothing else: one call of a
    bare name with literal keyword arguments, the name none that the eval could find besides the backends'
    methods (a builtin, a global or a local of the package's executing function; an unknown name fails)."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    try:
        node = ast.parse(call, mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return False
        if any(keyword.arg is None for keyword in node.keywords):  # **arguments: not literal
            return False
        for keyword in node.keywords:
            ast.literal_eval(keyword.value)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return False
    found = {*dir(builtins), *vars(multi_turn_utils)}
    found |= set(multi_turn_utils.execute_multi_turn_func_call.__code__.co_varnames)
    return node.func.id not in found


def relative_path(path: Any, result_dir: Path) -> dict[str, str]:
    """A path in an entry (a memory item's result folder) as the sandbox's own: relative to the result folder."""
    if isinstance(path, Path) and path.is_relative_to(result_dir):
        return {"__path__": path.relative_to(result_dir).as_posix()}
    raise TypeError(f"an item's entry holds {path!r}, which cannot be sent to the sandbox")


def snapshots(model_dir: Path, result_dir: Path) -> dict[str, str]:
    """The memory snapshots already written, by their path under the result folder. They go into the item's
    sandbox, where the model's code can read them: each is read as handed over (a link planted in the folder
    would send the file it names; a FIFO would block), and one that is not UTF-8 is refused."""
    found = model_dir.rglob("*") if model_dir.exists() else []
    named = [p for p in found if "memory_snapshot" in p.relative_to(model_dir).parts and not p.is_dir()]
    texts = {}
    for path in named:
        data = bfcl.read_out_file(path, result_dir, MAX_EXCHANGE_BYTES)
        try:
            texts[path.relative_to(result_dir).as_posix()] = data.decode("utf-8")
        except UnicodeDecodeError:
            raise EvalError(f"{path} is not UTF-8 text: not a memory snapshot; pass another out folder") from None
    return texts


def write_snapshots(sent: Any, before: dict[str, str], result_dir: Path) -> None:
    """The memory snapshots the item wrote or changed, written back; only JSON files under a memory snapshot
    folder of our model's results, since what the sandbox sends is the model's to shape."""
    if not isinstance(sent, dict):
        return
    for name, text in sent.items():
        if not isinstance(text, str) or before.get(name) == text:
            continue
        relative = safe_name(name, (".json",))
        if relative.parts[0] != bfcl.model_dir() or "memory_snapshot" not in relative.parts:
            raise SandboxError(f"the sandbox sent a file outside the memory snapshots: {name[:200]!r}")
        write_inside(result_dir, relative, text.encode())


def write_inside(folder: Path, relative: PurePosixPath, data: bytes) -> None:
    """A file the sandbox sent, written below `folder` and nowhere else (a link there is refused up front,
    `out_folder.refuse_links`; this holds against one made while the eval runs)."""
    try:
        files.write_inside(folder, relative, data)
    except OSError as exc:
        raise SandboxError(f"cannot write {folder / relative}: {exc.strerror or exc}") from None


def safe_name(name: Any, suffixes: tuple[str, ...]) -> PurePosixPath:
    """A relative path the sandbox named, refused unless it stays below its folder and has one of `suffixes`."""
    path = PurePosixPath(name) if isinstance(name, str) else PurePosixPath("/")
    if (
        path.is_absolute()
        or not path.parts
        or any(part in ("..", ".", "") for part in path.parts)
        or path.suffix not in suffixes
        or "\x00" in str(path)
    ):
        raise SandboxError(f"the sandbox named a file it may not write: {str(name)[:200]!r}")
    return path
