"""Benchmark: how much of each turn's prompt real vLLM serves from its prefix cache over a long run, in
token mode and in chat mode, with the reference's keep-5 (only the last 5 tool results shown), and our
runtime's share of each turn's wall time.

A real `nanbeige ask` of N turns (default 100) runs against vLLM's CPU build serving SmolLM2-135M-Instruct
(the real-vLLM tier's set-up: tests/real_vllm.py). So that so small a model calls a tool on every turn, a
loopback proxy adds a regex to each request (vLLM's `structured_outputs`): vLLM samples, under that
constraint, a well-formed `<use_mcp_tool>` call of the test server's `page` tool (about 700 characters
of text a call, like a search result). Everything else is real: our prompts, vLLM's prefix cache and its
token ids. The proxy passes one request at a time and reads vLLM's prefix-cache counters before and after
each, so every turn's lookups and hits are its own.

    .venv-vllm/bin/python tests/benchmarks/vllm_prefix_cache.py [--turns 100] [--base-url URL] [--save DIR]
    .venv-vllm/bin/python tests/benchmarks/vllm_prefix_cache.py --report DIR    # the numbers of a saved run

Three runs: token mode with every result kept, then token mode and chat mode with keep-5. A reply the
model did not finish (past SmolLM2's own 8k context it writes a character a token) is rolled back and
its prompt sent again, all of it from the cache: such retries are counted, and left out of the rates.

Without --base-url it starts its own server with `nanbeige serve` (vLLM must be installed in this Python).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/

from conftest import TEST_SERVER, free_port  # noqa: E402
from real_vllm import NANBEIGE, SERVED_NAME, RecordingProxy, smollm2_hf_folder, start_server  # noqa: E402

from nanbeige.agent.trajectory.trajectory_file import load_trajectories  # noqa: E402

# The topic from a closed list and a number: a run past SmolLM2's own 8k context still writes whole words
# (free letters degenerate there into one letter a token until the reply is cut off and rolled back).
WORDS = "(river|census|harbour|railway|museum|village|bridge|market|temple|island|valley|festival)"
CALL = (
    r"<use_mcp_tool>\n<server_name>calc</server_name>\n<tool_name>page</tool_name>\n<arguments>\n"
    rf'\{{"topic": "{WORDS} {WORDS} [1-9][0-9]?"\}}\n</arguments>\n</use_mcp_tool>'
)


def force_a_call(request: dict[str, Any]) -> dict[str, Any]:
    return request | {"structured_outputs": {"regex": CALL}, "return_token_ids": True}


def one_run(url: str, folder: Path, slug: str, turns: int, token_mode: bool, keep: int, max_tokens: int) -> None:
    """One `ask` run through the proxy; its trajectory and per-request numbers are saved in `folder`."""
    proxy = RecordingProxy(url, rewrite=force_a_call, measure_cache=True)
    trajectory = folder / f"{slug}.jsonl"
    try:
        result = subprocess.run(
            [
                NANBEIGE,
                "ask",
                "--base-url",
                proxy.url,
                "--model",
                SERVED_NAME,
                "--dialect",
                "mcp-xml",
                "--token-mode" if token_mode else "--no-token-mode",
                "--keep-tool-results",
                str(keep),
                "--max-turns",
                str(turns),
                "--max-tokens",
                str(max_tokens),
                "--temperature",
                "1.0",
                "--max-context",
                "32768",
                "--no-summary-turn",
                "--no-default-servers",
                "--mcp",
                "calc=" + " ".join(TEST_SERVER),
                "--trajectory",
                str(trajectory),
                "Tell me about the towns of the valley.",
            ],
            capture_output=True,
            text=True,
            timeout=7200,
        )
    finally:
        proxy.close()
    sent = [x for x in proxy.exchanges if x.path.endswith("completions")]
    if result.returncode not in (0, 1) or not sent:
        raise SystemExit(f"the run failed: {result.stderr[-2000:]}")
    requests = request_numbers(sent)
    (folder / f"{slug}.requests.json").write_text(json.dumps(requests))


def request_numbers(sent: list[Any]) -> list[dict[str, Any]]:
    """Each request's numbers: its prompt's length, what vLLM looked up in its cache and found, its seconds, how much
    of the prompt repeats the last prompt and its reply, how much of the last was rewritten, and whether it is a
    retry."""
    requests, last, last_prompt = [], None, None
    for exchange in sent:
        prompt = _prompt_ids(exchange)
        # What the cache could have had: the part of this prompt that repeats the last prompt and its reply.
        # The rest of the last request (rewritten: keep-K's placeholder for an old result) is the layout's cost.
        same = (
            next((k for k, (x, y) in enumerate(zip(last, prompt)) if x != y), min(len(last), len(prompt)))
            if last is not None
            else 0
        )
        requests.append(
            {
                "prompt": len(prompt),
                "looked_up": exchange.cache[0],
                "hits": exchange.cache[1],
                "seconds": exchange.seconds,
                "reusable": same,
                "rewritten": len(last) - same if last is not None else 0,
                "retry": prompt == last_prompt,
            }
        )  # a rolled-back reply's prompt, sent again
        last, last_prompt = prompt + exchange.token_ids, prompt
    return requests


def _prompt_ids(exchange: Any) -> list[int]:
    """The prompt as token ids: sent as such in token mode, echoed by vLLM in chat mode."""
    prompt = exchange.request.get("prompt")
    return prompt if isinstance(prompt, list) else exchange.prompt_token_ids or []


def report(name: str, folder: Path, slug: str) -> None:
    [run] = load_trajectories(folder / f"{slug}.jsonl")
    every = json.loads((folder / f"{slug}.requests.json").read_text())
    # A retry of a rolled-back reply sends the same prompt again, all of it in the cache: left out here.
    firsts = [r for r in every if not r["retry"]]
    looked_up, hits = sum(r["looked_up"] for r in firsts), sum(r["hits"] for r in firsts)
    rates = [r["hits"] / r["looked_up"] for r in firsts if r["looked_up"]]
    computed = [r["looked_up"] - r["hits"] for r in firsts]
    evicted = [r["rewritten"] for r in firsts if r["rewritten"]]
    vllm_missed = [r["reusable"] - r["hits"] for r in firsts[1:]]  # the first prompt: nothing to compare
    calls = sum(len(turn.tool_calls) for turn in run.turns)
    timings = run.timings
    ours = timings["wall_s"] - timings["model_s"] - timings["tool_s"]
    print(
        f"{name}: {len(every)} model calls ({len(every) - len(firsts)} retries of a rolled-back reply, left out "
        f"below), {calls} tool calls, stop reason {run.stop_reason}"
    )
    print(
        f"  prompt tokens looked up {looked_up:.0f}, from the prefix cache {hits:.0f}: "
        f"{hits / max(looked_up, 1):.1%} overall; per turn median {statistics.median(rates):.1%}, "
        f"lowest after turn 1 {min(rates[1:]):.1%}"
    )
    last_50 = firsts[-50:]
    print(f"  the last 50 turns: {sum(r['hits'] for r in last_50) / sum(r['looked_up'] for r in last_50):.1%}")
    print(
        f"  tokens computed anew per turn: median {statistics.median(computed):.0f}, max {max(computed):.0f}; "
        f"last prompt {firsts[-1]['prompt']} tokens"
    )
    print(
        f"  turns whose prompt rewrote the last request (keep-K): {len(evicted)}; tokens rewritten and so computed"
        f" again: median {statistics.median(evicted) if evicted else 0:.0f} a turn, {sum(evicted)} in all"
    )
    print(
        f"  reusable tokens vLLM did not serve from its cache: {sum(vllm_missed):.0f} in all, at most "
        f"{max(vllm_missed):.0f} a turn (it caches whole blocks of 128 tokens on the CPU)"
    )
    print(
        f"  wall {timings['wall_s']:.1f} s = model {timings['model_s']:.1f} s + tools {timings['tool_s']:.1f} s + "
        f"runtime {ours:.1f} s ({ours / timings['wall_s']:.2%} of the wall; "
        f"{ours / len(every) * 1000:.0f} ms a turn)"
    )
    print(f"  hit rate per turn: {' '.join(f'{r:.0%}' for r in rates)}")


MODES = (
    ("token mode, every result kept", "token-keep-all", True, -1),
    ("token mode, keep-5", "token-keep-5", True, 5),
    ("chat mode, keep-5", "chat-keep-5", False, 5),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--base-url", help="a vLLM server already serving SmolLM2 as 'smollm2' (32k context)")
    # a call is about 150 characters, and past its own context the model writes one a token
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--save", type=Path, help="keep each run's trajectory and per-request numbers here")
    parser.add_argument("--report", type=Path, help="only print the numbers of runs saved with --save")
    args = parser.parse_args()
    if args.report:
        for name, slug, _, _ in MODES:
            report(name, args.report, slug)
        return
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.save or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        server = None
        url = args.base_url
        if url is None:
            model = smollm2_hf_folder(Path(scratch) / "smollm2")
            # 32k tokens: a 100-turn run's history; past SmolLM2's 8k, which vLLM allows only when told to
            os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
            server = start_server(model, free_port(), Path(scratch) / "serve.log", max_model_len=32768)
            url = server.url
        try:
            for name, slug, token_mode, keep in MODES:
                one_run(url, folder, slug, args.turns, token_mode, keep, args.max_tokens)
                report(name, folder, slug)
        finally:
            if server is not None:
                server.stop()


if __name__ == "__main__":
    main()
