"""Benchmark: scrape + extract latency on loopback.

A loopback site serves an HTML article and a PDF; the extraction model is the loopback fake
OpenAI server (it answers at once, so the numbers are the runtime's own cost: fetch, HTML/PDF
conversion, the extraction request). Jina Reader is the loopback fake of its API.

    python tests/benchmarks/scrape.py [--calls 100]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the fakes

from fake_openai import FakeOpenAI  # noqa: E402
from fake_site import Site  # noqa: E402

from nanbeige.tools.fetch import FetchPolicy  # noqa: E402
from nanbeige.tools.scrape import EXTRACTION_ENDPOINT, ScrapeConfig, scrape_and_extract_info  # noqa: E402


async def public(host: str) -> list[str]:
    return ["93.184.216.34"]  # Jina is asked for a public page; the reader itself is on loopback


async def timings(url: str, config: ScrapeConfig, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        await scrape_and_extract_info(url, "the length of a year", None, config)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    with Site() as site, FakeOpenAI([], default="A Martian year lasts 687 Earth days.") as model:
        summary = replace(EXTRACTION_ENDPOINT, base_url=model.base_url)
        direct = ScrapeConfig(summary=summary, policy=FetchPolicy(allow_private=True))
        jina = ScrapeConfig(
            summary=summary,
            backend="jina",
            jina_api_key="k",
            jina_base_url=site.url("/jina"),
            policy=FetchPolicy(resolve=public),
        )
        cases = {
            "direct, HTML article": (site.url("/article"), direct),
            "direct, PDF": (site.url("/paper.pdf"), direct),
            "Jina Reader API": ("https://example.org/mars", jina),
        }
        print(f"scrape + extract on loopback, {args.calls} calls each (ms)")
        print(f"{'':24} {'p50':>8} {'p95':>8}")
        for name, (url, config) in cases.items():
            samples = sorted(asyncio.run(timings(url, config, args.calls)))
            p95 = samples[min(len(samples) - 1, round(0.95 * (len(samples) - 1)))]
            print(f"{name:24} {statistics.median(samples):>8.2f} {p95:>8.2f}")


if __name__ == "__main__":
    main()
