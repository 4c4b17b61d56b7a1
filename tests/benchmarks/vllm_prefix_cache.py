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

    .venv-vllm/bin/python tests/benchmarks/vllm_prefix_cache.py [--turns 100] [--base-url URL --model NAME]

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
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/

from conftest import TEST_SERVER, free_port  # noqa: E402
from real_vllm import NANBEIGE, SERVED_NAME, RecordingProxy, smollm2_hf_folder, start_server  # noqa: E402

from nanbeige.agent.trajectory import load_trajectories  # noqa: E402

# The topic from a closed list and a number: a run past SmolLM2's own 8k context still writes whole words
# (free letters degenerate there into one letter a token until the reply is cut off and rolled back).
WORDS = "(river|census|harbour|railway|museum|village|bridge|market|temple|island|valley|festival)"
CALL = (r'<use_mcp_tool>\n<server_name>calc</server_name>\n<tool_name>page</tool_name>\n<arguments>\n'
        rf'\{{"topic": "{WORDS} {WORDS} [1-9][0-9]?"\}}\n</arguments>\n</use_mcp_tool>')


def force_a_call(request: dict[str, Any]) -> dict[str, Any]:
    return request | {"structured_outputs": {"regex": CALL}, "return_token_ids": True}


def one_run(url: str, folder: Path, turns: int, token_mode: bool, keep: int) -> dict[str, Any]:
    proxy = RecordingProxy(url, rewrite=force_a_call, measure_cache=True)
    trajectory = folder / f"{'token' if token_mode else 'chat'}-keep{keep}.jsonl"
    started = time.monotonic()
    try:
        result = subprocess.run(
            [NANBEIGE, "ask", "--base-url", proxy.url, "--model", SERVED_NAME, "--dialect", "mcp-xml",
             "--token-mode" if token_mode else "--no-token-mode", "--keep-tool-results", str(keep),
             "--max-turns", str(turns), "--max-tokens", "128", "--temperature", "1.0", "--max-context", "32768",
             "--no-summary-turn", "--no-default-servers", "--mcp", "calc=" + " ".join(TEST_SERVER),
             "--trajectory", str(trajectory), "Tell me about the towns of the valley."],
            capture_output=True, text=True, timeout=3600)
    finally:
        proxy.close()
    wall_s = time.monotonic() - started
    [run] = load_trajectories(trajectory)
    sent = [x for x in proxy.exchanges if x.path.endswith("completions")]
    if result.returncode not in (0, 1) or not sent:
        raise SystemExit(f"the run failed: {result.stderr[-2000:]}")
    return {"run": run, "sent": sent, "wall_s": wall_s, "stderr": result.stderr}


def _prompt_ids(exchange: Any) -> list[int]:
    """The prompt as token ids: sent as such in token mode, echoed by vLLM in chat mode."""
    prompt = exchange.request.get("prompt")
    return prompt if isinstance(prompt, list) else exchange.prompt_token_ids or []


def report(name: str, measured: dict[str, Any]) -> None:
    run, sent = measured["run"], measured["sent"]
    queries = [x.cache[0] for x in sent]
    hits = [x.cache[1] for x in sent]
    rates = [h / q for q, h in zip(queries, hits) if q]
    calls = sum(len(turn.tool_calls) for turn in run.turns)
    # What the cache could have had: the part of this prompt that repeats the last prompt and its reply.
    # The rest of the last request (rewritten: keep-K's placeholder for an old result) is the layout's
    # cost; a miss within the reusable part is vLLM's (it caches whole blocks, 128 tokens on the CPU).
    reusable, rewritten = [0], [0]
    for before, now in zip(sent, sent[1:]):
        last = _prompt_ids(before) + before.token_ids
        same = next((k for k, (x, y) in enumerate(zip(last, _prompt_ids(now))) if x != y), min(len(last), len(
            _prompt_ids(now))))
        reusable.append(same)
        rewritten.append(len(last) - same)
    vllm_missed = [r - h for r, h in zip(reusable[1:], hits[1:])]  # the first prompt: nothing to compare
    timings = run.timings
    ours = timings["wall_s"] - timings["model_s"] - timings["tool_s"]
    rolled_back = sum(turn.rolled_back for turn in run.turns)
    print(f"{name}: {len(sent)} model calls, {calls} tool calls, {rolled_back} replies rolled back, "
          f"stop reason {run.stop_reason}")
    print(f"  prompt tokens looked up {sum(queries):.0f}, from the prefix cache {sum(hits):.0f}: "
          f"{sum(hits) / max(sum(queries), 1):.1%} overall; per turn median {statistics.median(rates):.1%}, "
          f"lowest after turn 1 {min(rates[1:]):.1%}")
    print(f"  tokens computed anew per turn (the prompt's new part and what the cache missed): median "
          f"{statistics.median(q - h for q, h in zip(queries, hits)):.0f}, max {max(q - h for q, h in zip(queries, hits)):.0f}")
    print(f"  last prompt {queries[-1]:.0f} tokens; wall {timings['wall_s']:.1f} s = model {timings['model_s']:.1f} s"
          f" + tools {timings['tool_s']:.1f} s + runtime {ours:.1f} s ({ours / timings['wall_s']:.1%} of the wall;"
          f" {ours / len(sent) * 1000:.0f} ms a turn)")
    print(f"  hit rate per turn: {' '.join(f'{r:.0%}' for r in rates)}")
    print(f"  rewritten per turn: {' '.join(str(r) for r in rewritten)}")
    evicted = [r for r in rewritten if r]
    print(f"  turns whose prompt rewrote the last one (keep-K): {len(evicted)}; tokens of the last request rewritten"
          f" and so computed again: median {statistics.median(evicted) if evicted else 0:.0f} a turn, "
          f"{sum(evicted)} in all")
    print(f"  reusable tokens vLLM did not serve from its cache: {sum(vllm_missed):.0f} in all, at most "
          f"{max(vllm_missed):.0f} a turn (it caches whole blocks of 128 tokens on the CPU)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--base-url", help="a vLLM server already serving SmolLM2 as 'smollm2' (32k context)")
    parser.add_argument("--json", type=Path, help="also write the per-turn numbers here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        server = None
        url = args.base_url
        if url is None:
            model = smollm2_hf_folder(Path(folder) / "smollm2")
            # 32k tokens: a 100-turn run's history; past SmolLM2's 8k, which vLLM allows only when told to
            os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
            server = start_server(model, free_port(), Path(folder) / "serve.log", max_model_len=32768)
            url = server.url
        try:
            results = {}
            for name, token_mode, keep in (("token mode, every result kept", True, -1),
                                           ("token mode, keep-5", True, 5), ("chat mode, keep-5", False, 5)):
                results[name] = one_run(url, Path(folder), args.turns, token_mode, keep)
                report(name, results[name])
            if args.json:
                args.json.write_text(json.dumps({name: [list(x.cache) + [x.seconds] for x in r["sent"]]
                                                 for name, r in results.items()}))
        finally:
            if server is not None:
                server.stop()


if __name__ == "__main__":
    main()
