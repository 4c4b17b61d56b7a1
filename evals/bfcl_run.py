"""Running BFCL through its own pipeline (`evals/bfcl.py`) with our conveniences around it.

The out folder holds, besides `eval.json` and `report.json`:

    bfcl/result/<model>/<group>/BFCL_v4_<category>_result.json   the official generator's result lines
    bfcl/score/<model>/...                                          the official runner's score files
    bfcl/score/data_overall.csv (and data_non_live.csv, ...)        its summary tables
    bfcl/generator.log, bfcl/runner.log                              what the handler and the runner printed
    trajectories.jsonl                                               every item's model calls

An item is done when its line is in a result file; resuming runs only the others, so a killed eval loses
at most the items in flight. A model server that fails is not a wrong answer: such an item gets no line
and is run again on resume. Grading happens once every item is done, by the official runner
(`bfcl_grading.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import time
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from nanbeige.agent.run.run_config import RunSettings
from nanbeige.agent.trajectory.trajectory import Trajectory, Turn
from nanbeige.evals import bfcl, bfcl_exchange, bfcl_jail
from nanbeige.evals.bfcl_grading import append_log, grade, tidy_results
from nanbeige.evals.eval_config import EvalConfig, EvalError
from nanbeige.evals.out_folder import REPORT, TRAJECTORIES, prepare_out
from nanbeige.evals.runner import Progress, failed_run_errors, run_all
from nanbeige.tools.sandbox import SandboxError
from nanbeige.tools.wire import ACCEPT_ENCODING, answer_within, run_blocking

TOKENIZE_TIMEOUT_S = 60.0
"""Most seconds one `/tokenize` call may take in all, from the request to the answer's last byte."""
MAX_TOKENIZE_BYTES = 16 * 2**20
"""The longest answer to `/tokenize`: the ids of a whole 262,144-token context are a few MB."""

if TYPE_CHECKING:
    from nanbeige.agent.setup.setup import Ready
    from nanbeige.evals.tasks import Task


def settings_for_bfcl(settings: RunSettings) -> RunSettings:
    """No tool servers (the handler offers the item's functions in its own prompt), and the official
    generator's temperature unless one was given."""
    llm = (
        settings.llm
        if settings.llm.temperature is not None
        else dataclasses.replace(settings.llm, temperature=bfcl.TEMPERATURE)
    )
    tools = dataclasses.replace(settings.tools, default_servers=False, mcp=[])
    return dataclasses.replace(settings, llm=llm, tools=tools, trajectory=None)


async def evaluate(
    config: EvalConfig,
    settings: RunSettings,
    notice: Callable[[str], None],
    progress_view: Callable[[Progress], Any] | None = None,
) -> dict[str, Any]:
    """Generate every item not yet in the result files, then grade them all with the official runner."""
    from nanbeige.agent.setup.setup import ready

    tasks = bfcl.load(config.bench.name.removeprefix("bfcl").lstrip("-").replace("-", "_") or "all")
    tasks = tasks[: config.limit] if config.limit else tasks
    config = dataclasses.replace(config, k=1)
    found = prepare_out(config, tasks)
    (config.out / "bfcl").mkdir(exist_ok=True)
    tidy_results(config.out)
    append_log(config.out / "bfcl" / "generator.log").close()  # one that is no file: said now, not once a model is up
    pending = to_generate(config.out, tasks)
    progress = Progress(total=len(tasks), done=len(tasks) - len(pending))
    if pending:
        if progress.done:
            notice(f"resuming: {progress.done} of {progress.total} items already done in {config.out}")
        settings = dataclasses.replace(settings_for_bfcl(settings), trajectory=config.out / TRAJECTORIES)
        async with (
            ready(settings, without_tools_notice(notice)) as runtime,
            web_search(pending),
            bfcl_jail.sandboxes(any(bfcl_jail.runs_model_text(t.level) for t in pending)) as jail,
        ):
            attempt = item_attempt(runtime, config.out, settings.llm.temperature, notice, jail)
            view = progress_view(progress) if progress_view else None
            # the handler prints what it does (and what the model got wrong) on stdout, where our report goes
            with append_log(config.out / "bfcl" / "generator.log") as log, contextlib.redirect_stdout(log):
                try:
                    await run_in_order(pending, attempt, config.concurrency, progress)
                finally:
                    if view is not None:
                        view.stop()
    report = grade(config.out, found)
    report["failed_runs"], report["failed_run_errors"] = progress.failed, failed_run_errors(config, settings, progress)
    (config.out / REPORT).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return report


def to_generate(out: Path, tasks: list[Task]) -> list[Task]:
    """The items without a result line, set up as the official generator sets them up before it runs
    them (`collect_test_cases`: a memory item's dependencies on prerequisites already done dropped, its
    memory snapshot folder and a web search item's snippet setting filled in), in its order."""
    package = bfcl.official()
    entries = [copy.deepcopy(task.metadata["entry"]) for task in tasks]
    categories = sorted({package.utils.extract_test_category_from_id(e["id"], remove_prereq=True) for e in entries})
    args = types.SimpleNamespace(result_dir=bfcl.result_dir(out), allow_overwrite=False, run_ids=False)
    by_id = {task.id: task for task in tasks}
    cases = package.generation.collect_test_cases(args, bfcl.HANDLER_ENTRY, categories, entries)
    return [
        dataclasses.replace(by_id[case["id"]], metadata=by_id[case["id"]].metadata | {"entry": case}) for case in cases
    ]


async def run_in_order(pending: list[Task], attempt: Any, concurrency: int, progress: Progress) -> None:
    """The items in waves: each wave, every item whose dependencies (`depends_on`: a memory category's
    prerequisite conversations) are all done, `concurrency` at a time. An item whose dependency failed
    stays undone, for the next resume (the official generator would wait for it forever)."""
    waiting, finished = list(pending), set()
    while waiting:
        ready = [t for t in waiting if all(d in finished for d in t.metadata["entry"].get("depends_on", []))]
        if not ready:
            return
        waiting = [t for t in waiting if t not in ready]
        await run_all([(t, 0) for t in ready], attempt, concurrency, progress, lambda row: finished.add(row["task_id"]))


@contextlib.asynccontextmanager
async def web_search(pending: list[Task]) -> Any:
    """For the web search categories, our search backend in place of the official engine (unless that is
    installed with its key), answering from this event loop; EvalError when none is configured."""
    if bfcl.official_search() or not any(t.level in bfcl.WEB_SEARCH for t in pending):
        yield
        return
    from nanbeige.tools.search import Searcher, SearchError
    from nanbeige.tools.search_config import SearchUnavailable, config_from_env, search_setup_problem

    problem = search_setup_problem(config_from_env())
    if problem:
        raise EvalError(f"BFCL's web search needs a search backend: {problem}")
    loop = asyncio.get_running_loop()
    async with Searcher() as searcher:

        def search(keywords: str, count: int) -> list[dict[str, str]]:
            try:
                found = asyncio.run_coroutine_threadsafe(searcher.google_search(keywords, num=count), loop).result()
            except SearchError:
                return []
            except SearchUnavailable as exc:  # raised into the package's code, which reports it as an error
                raise RuntimeError(str(exc)) from None
            return [
                {"title": r.get("title", ""), "link": r.get("link", ""), "snippet": r.get("snippet", "")}
                for r in found.get("organic", [])
            ][:count]

        bfcl.use_search(search)
        try:
            yield
        finally:
            bfcl.use_search(None)


def without_tools_notice(notice: Callable[[str], None]) -> Callable[[str], None]:
    """`notice`, without the setup's line that the runs have no tools: BFCL's tools are in its prompts."""
    return lambda line: None if line.startswith("no tools available") else notice(line)


# ---------------------------------------------------------------- one item


def item_attempt(
    runtime: Ready,
    out: Path,
    temperature: float | None,
    notice: Callable[[str], None],
    jail: bfcl_jail.Jail | None = None,
) -> Any:
    """Runs one item through the official handler in a worker thread, its model calls answered by our
    backend on this event loop; writes the item's result line and trajectory. An item whose calls the
    handler executes (multi-turn, agentic) runs in `jail`'s sandbox instead, the handler's questions asked
    from there."""
    loop = asyncio.get_running_loop()
    llm = runtime.llm
    tokenizer, context_length = prompt_sizes(runtime, notice)

    def complete(prompt: str, max_tokens: int, temperature: float) -> tuple[str, int, int]:
        call = llm.complete_text(prompt, max_tokens, temperature)  # type: ignore[attr-defined]
        completion = asyncio.run_coroutine_threadsafe(call, loop).result()
        usage = completion.usage
        return completion.message["content"], usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)

    handler = bfcl.handler_for(
        tokenizer, context_length, llm.config.model, temperature if temperature is not None else bfcl.TEMPERATURE
    )

    async def attempt(task: Task, run_index: int) -> dict[str, Any] | str:
        completions = bfcl.Completions(complete)
        started = time.monotonic()
        if bfcl_jail.runs_model_text(task.level):
            if jail is None:
                raise EvalError("BFCL's multi-turn and agentic items run only in a sandbox")  # never in this process
            run = {"temperature": handler.temperature, "model": llm.config.model, "max_context_length": context_length}
            try:
                result = await asyncio.to_thread(
                    jail.infer,
                    task.metadata["entry"],
                    bfcl.result_dir(out),
                    bfcl_exchange.host_answers(completions, handler, task.metadata["entry"]),
                    run,
                )
            except SandboxError as exc:  # this machine's failure, not the model's: run again on resume
                return f"the sandbox for BFCL's item failed: {exc}"
        else:
            result = await asyncio.to_thread(bfcl.infer, handler, task.metadata["entry"], completions)
        if completions.failure:  # the backend failed, not the model: not recorded, run again on resume
            return completions.failure
        bfcl.write(handler, result, out)
        write_trajectory(runtime, task, completions.calls, result, time.monotonic() - started)
        return {"task_id": task.id, "run": run_index, "correct": None, "turns": len(completions.calls)}

    return attempt


def prompt_sizes(runtime: Ready, notice: Callable[[str], None]) -> tuple[Any, int]:
    """What the handler counts prompts with, and the context length it subtracts them from.

    The official generator loads the model's tokenizer and reads `max_position_embeddings` from its
    config. A model in this process gives both; a server gives its `/tokenize` and the length it lists
    (deviation: the server's limit, not the config's; they differ only where the server was started
    with a shorter one)."""
    llm = runtime.llm
    tokenizer = getattr(llm, "tokenizer", None) or getattr(getattr(llm, "prompter", None), "tokenizer", None)
    model = getattr(llm, "model", None)
    length = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if length is None and runtime.server is not None:
        length = runtime.server.max_model_len
    if tokenizer is None:
        tokenizer = ServerTokenizer(llm.config.base_url, llm.config.model, llm.config.api_key, notice)
    return tokenizer, int(length or runtime.agent.max_context or 32768)


class ServerTokenizer:
    """`.tokenize(text)` by the server's `/tokenize` (vLLM's); where a server has none, the length is
    estimated at 3 characters a token, and a notice says so once. Each call is bounded in all
    (`TOKENIZE_TIMEOUT_S`, headers included) and in size (`MAX_TOKENIZE_BYTES`), and goes to the server
    itself, never through a proxy named in the environment."""

    def __init__(self, base_url: str, model: str, api_key: str | None, notice: Callable[[str], None]):
        self.root = base_url.rstrip("/").removesuffix("/v1")
        self.headers = {**ACCEPT_ENCODING, **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        self.model, self.notice, self.estimate = model, notice, False

    async def _count(self, text: str) -> Any:
        import httpx

        async with httpx.AsyncClient(headers=self.headers, timeout=TOKENIZE_TIMEOUT_S, trust_env=False) as http:
            request = http.build_request("POST", f"{self.root}/tokenize", json={"model": self.model, "prompt": text})
            response = await answer_within(http, request, TOKENIZE_TIMEOUT_S, MAX_TOKENIZE_BYTES)
        return response.json().get("count") if response.status_code == 200 else None

    def tokenize(self, text: str) -> list[int]:
        import httpx

        if not self.estimate:
            try:
                count = run_blocking(self._count(text))
                if isinstance(count, int):
                    return [0] * count
            except (httpx.HTTPError, httpx.InvalidURL, ValueError, AttributeError):
                pass
            self.estimate = True
            self.notice(
                "the model server has no /tokenize: BFCL's prompt sizes are estimated (3 characters a "
                "token); they only decide max_tokens near the context limit"
            )
        return [0] * (len(text) // 3)


def write_trajectory(
    runtime: Ready, task: Task, calls: list[dict[str, Any]], result: dict[str, Any], wall_s: float
) -> None:
    """The item's model calls as a trajectory: one turn per call, the handler's prompt text as the first
    turn's user message (every prompt is also in the result line's `inference_log`)."""
    trajectory = Trajectory(
        question=task.question,
        group_id=task.id,
        grader=bfcl.GRADER,
        user_message=calls[0]["prompt"] if calls else "",
        model=runtime.llm.config.model,
        dialect="bfcl-" + bfcl.HANDLER_ENTRY,
    )
    runtime.writer.start(trajectory)
    for index, call in enumerate(calls):
        turn = Turn(index=index, assistant={"role": "assistant", "content": call["text"]}, usage=call["usage"])
        trajectory.turns.append(turn)
        runtime.writer.turn(trajectory, turn)
    answer = result.get("result")
    trajectory.answer = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
    trajectory.stop_reason, trajectory.timings = "answered", {"wall_s": wall_s}
    runtime.writer.end(trajectory)
