"""Every HTTP client of the program reads an answer bounded, whoever sends it (`tools/wire.py`): one content
coding at most, gzip or deflate, checked before a byte of the body is read (nested codings inflate a few KB
to gigabytes in one call, before any size cap); a deadline over the whole request, its headers included (a
server trickling its status line a byte at a time trips no read timeout); a size cap. And whatever goes
wrong in the egress guard is its FetchError, one line. The servers are real loopback sockets
(`raw_endpoints.py`)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_openai import FakeOpenAI
from raw_endpoints import RawEndpoint, coded, nested_gzip_bomb, redirect_with_endless_body, slow_headers

from nanbeige.agent.backends.llm import LLMConfig, OpenAIChat
from nanbeige.agent.backends.model_server import ModelUnavailable, ServerInfo, UnusableReply, probe_server
from nanbeige.evals import bfcl_run
from nanbeige.evals.endpoint import CallFailed, chat_text
from nanbeige.tools import egress
from nanbeige.tools.egress import FetchError, FetchPolicy
from nanbeige.tools.endpoint import ChatEndpoint
from nanbeige.tools.fetch import fetch_direct
from nanbeige.tools.scrape import EXTRACTION_ENDPOINT, ScrapeConfig, ScrapeError, extract_info, fetch_jina
from nanbeige.tools.search import Searcher
from nanbeige.tools.search_config import SearchConfig, SearchUnavailable
from nanbeige.trainer import sync

MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]
LOCAL = FetchPolicy(allow_private=True)
REPLY = json.dumps({"choices": [{"message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}]})
SMALL_BOMB = nested_gzip_bomb(4)  # 64 MiB of zeros under two gzip layers: enough to see, safe to inflate here


def chat_client(base_url: str, **config: Any) -> OpenAIChat:
    return OpenAIChat(LLMConfig(base_url=base_url, model="m", max_attempts=1, **config), server=ServerInfo(vllm=False))


@pytest.mark.anyio
async def test_every_client_refuses_an_answer_in_nested_codings() -> None:
    with RawEndpoint(coded(SMALL_BOMB, "gzip, gzip")) as bomb:
        with pytest.raises(FetchError, match=r"could not fetch .*coded 'gzip, gzip': only one coding"):
            await egress.get(bomb.url + "/", LOCAL)
        with pytest.raises(FetchError, match="coded 'gzip, gzip'"):
            await fetch_direct(bomb.url + "/page", LOCAL)
        with pytest.raises(ModelUnavailable, match="UnsafeEncoding"):
            probe_server(bomb.base_url, None, timeout=5.0)
        model = chat_client(bomb.base_url)
        try:
            with pytest.raises(UnusableReply, match="cannot be decoded: an answer coded 'gzip, gzip'"):
                await model.complete(MESSAGES)
            with pytest.raises(UnusableReply, match="cannot be decoded: an answer coded 'gzip, gzip'"):
                await model.complete(MESSAGES, on_text=lambda text: None)
        finally:
            await model.aclose()
        async with httpx.AsyncClient() as http:
            with pytest.raises(CallFailed, match="cannot be decoded"):
                await chat_text(http, ChatEndpoint(base_url=bomb.base_url, model="judge"), MESSAGES)
        with pytest.raises(sync.SyncError, match="UnsafeEncoding"):
            await sync.serves(bomb.base_url, "lora", "/ckpt/step-1")
        notices: list[str] = []
        tokenizer = bfcl_run.ServerTokenizer(bomb.base_url, "m", None, notices.append)
        assert tokenizer.tokenize("x" * 30) == [0] * 10 and "estimated" in notices[0]


@pytest.mark.anyio
async def test_codings_of_higher_ratios_are_refused_and_one_gzip_layer_is_read() -> None:
    with RawEndpoint(coded(b"\x0b\x01\x80hello\x03", "br")) as brotli:
        with pytest.raises(FetchError, match="coded 'br'"):
            await egress.get(brotli.url + "/", LOCAL)
    with RawEndpoint(coded(gzip.compress(REPLY.encode()), "gzip")) as honest:
        assert (await egress.get(honest.url + "/", LOCAL)).body == REPLY.encode()
        model = chat_client(honest.base_url)
        try:
            assert (await model.complete(MESSAGES)).message["content"] == "4"
        finally:
            await model.aclose()
        sent = httpx.Client().build_request("GET", honest.url).headers["accept-encoding"]
        assert sent == "gzip, deflate"  # what an honest server is offered: the two codings read


MEASURE = """
import resource, sys, anyio
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from nanbeige.agent.backends.llm import LLMConfig, OpenAIChat
from nanbeige.agent.backends.model_server import ModelUnavailable, ServerInfo, UnusableReply, probe_server
from nanbeige.tools import egress

base_url = sys.argv[1]
try:
    egress.get_blocking(base_url + "/page", egress.FetchPolicy(allow_private=True))
except egress.FetchError as exc:
    print("fetch:", exc)
try:
    probe_server(base_url + "/v1", None, timeout=5.0)
except ModelUnavailable as exc:
    print("probe:", exc)

async def ask(on_text):
    model = OpenAIChat(LLMConfig(base_url=base_url + "/v1", model="m", max_attempts=1), server=ServerInfo(vllm=False))
    try:
        await model.complete([{"role": "user", "content": "hi"}], on_text=on_text)
    except UnusableReply as exc:
        print("model:", exc)
    finally:
        await model.aclose()

anyio.run(ask, None)
anyio.run(ask, lambda text: None)
# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so it would count the test worker's own memory
peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print("peak MB", peak_kb // 1024)
"""


def test_a_decompression_bomb_of_3_kb_costs_no_memory(tmp_path: Path) -> None:
    """The real bomb, 2 GiB of zeros in 3.4 KB, against the guard, the probe and the model client (unstreamed
    and streamed), in a process allowed 1.5 GB of address space: each refuses it, and the peak stays small."""
    bomb = nested_gzip_bomb()
    assert len(bomb) < 4000
    script = tmp_path / "measure.py"
    script.write_text(textwrap.dedent(MEASURE))
    with RawEndpoint(coded(bomb, "gzip, gzip")) as server:
        done = subprocess.run(
            [sys.executable, str(script), server.url, str(1536 * 2**20)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "NO_PROXY": "*"},
        )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:4]] == ["fetch", "probe", "model", "model"], done.stdout
    assert all("gzip, gzip" in line or "UnsafeEncoding" in line for line in lines[:4]), done.stdout
    assert int(lines[-1].split()[-1]) < 400, done.stdout


def test_a_probe_whose_headers_trickle_fails_at_its_deadline() -> None:
    """What every command asks each model endpoint first: bounded in all, from the request on."""
    with RawEndpoint(slow_headers(0.2)) as slow:
        started = time.monotonic()
        with pytest.raises(ModelUnavailable, match="ReadTimeout"):
            probe_server(slow.base_url, None, timeout=1.0)
    assert time.monotonic() - started < 4


@pytest.mark.anyio
async def test_a_guarded_fetch_whose_headers_trickle_fails_at_its_deadline() -> None:
    policy = FetchPolicy(allow_private=True, read_timeout_s=5.0, deadline_s=1.0)
    with RawEndpoint(slow_headers(0.2)) as slow:
        started = time.monotonic()
        with pytest.raises(FetchError, match=r"no whole answer within 1 s"):
            await egress.get(slow.url + "/", policy)
    assert time.monotonic() - started < 4


@pytest.mark.anyio
async def test_an_engine_whose_headers_trickle_or_whose_list_floods_fails_the_sync() -> None:
    with RawEndpoint(slow_headers(0.2)) as slow:
        started = time.monotonic()
        async with sync.client(None, 1.0) as http:
            with pytest.raises(httpx.ReadTimeout, match="no whole answer within 1 s"):
                await sync.listed(http, slow.url)
        assert time.monotonic() - started < 4
    flood = json.dumps({"data": [{"id": "m", "root": "x" * sync.MAX_ANSWER_BYTES}]}).encode()
    with RawEndpoint(coded(flood, "identity")) as big:
        with pytest.raises(sync.SyncError, match="ReadError"):
            await sync.serves(big.base_url, "lora", "/ckpt/step-1")


@pytest.mark.anyio
async def test_the_scrape_tools_endpoints_are_held_to_the_same_limits() -> None:
    """Jina Reader fetches the page for us: its answer gets our own fetch's deadline, size cap and coding rule;
    the extraction model's answer its call's timeout in all."""
    policy = FetchPolicy(allow_private=True, deadline_s=0.5)  # the reader is asked 5 times
    summary = dataclasses.replace(EXTRACTION_ENDPOINT, timeout_s=1.0, retries=0)
    with RawEndpoint(slow_headers(0.2)) as slow:
        config = ScrapeConfig(
            backend="jina", jina_api_key="k", jina_base_url=slow.url, policy=policy, summary=summary, retry_wait_s=0.01
        )
        started = time.monotonic()
        with pytest.raises(FetchError, match="Jina Reader could not be reached: ReadTimeout"):
            await fetch_jina("https://example.com/", config)
        summary = dataclasses.replace(summary, base_url=slow.base_url)
        with pytest.raises(ScrapeError, match="ReadTimeout"):
            await extract_info("page", "the answer", dataclasses.replace(config, summary=summary))
        assert time.monotonic() - started < 5
    with RawEndpoint(coded(SMALL_BOMB, "gzip, gzip")) as bomb:
        config = ScrapeConfig(backend="jina", jina_api_key="k", jina_base_url=bomb.url, policy=policy, summary=summary)
        with pytest.raises(FetchError, match="UnsafeEncoding"):
            await fetch_jina("https://example.com/", config)


@pytest.mark.anyio
async def test_a_search_engine_whose_headers_trickle_or_that_sends_a_bomb_is_unavailable() -> None:
    for answer, why in ((slow_headers(0.2), "did not answer in 1 s"), (coded(SMALL_BOMB, "gzip, gzip"), "unreadable")):
        with RawEndpoint(answer) as engine:
            config = SearchConfig(backend="searxng", searxng_url=engine.url, timeout_s=1.0, max_attempts=1)
            started = time.monotonic()
            async with Searcher(config) as searcher:
                with pytest.raises(SearchUnavailable, match=why):
                    await searcher.google_search("anything")
            assert time.monotonic() - started < 4


def test_the_bfcl_tokenizer_counts_by_the_server_and_falls_back_when_it_trickles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    notices: list[str] = []
    with FakeOpenAI([], vllm=True) as server:
        text = "hello world, how are you"
        counted = bfcl_run.ServerTokenizer(server.base_url, "fake-model", None, notices.append).tokenize(text)
    assert len(counted) == len(server.tokenize(text)) and not notices
    monkeypatch.setattr(bfcl_run, "TOKENIZE_TIMEOUT_S", 1.0)
    with RawEndpoint(slow_headers(0.2)) as slow:
        started = time.monotonic()
        assert bfcl_run.ServerTokenizer(slow.base_url, "m", None, notices.append).tokenize("abcdef") == [0, 0]
    assert time.monotonic() - started < 4 and len(notices) == 1


@pytest.mark.anyio
async def test_a_redirects_body_is_not_read() -> None:
    """httpx reads a redirect's whole body before following it, uncapped; the guard follows redirects itself."""
    with RawEndpoint(redirect_with_endless_body) as server:
        started = time.monotonic()
        reply = await egress.get(server.url + "/start", FetchPolicy(allow_private=True, read_timeout_s=3.0))
    assert (reply.url, reply.body) == (server.url + "/end", b"ok") and time.monotonic() - started < 2


@pytest.mark.anyio
@pytest.mark.parametrize("url", ["http://①②⑦.0.0.1:18001/", "http://[::1/", "http://127.0.0.1:99999/"])
async def test_a_url_httpx_cannot_take_is_the_guards_one_line_error(url: str) -> None:
    with pytest.raises(FetchError):
        await egress.get(url, FetchPolicy())
