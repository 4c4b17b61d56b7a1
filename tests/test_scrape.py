"""Scrape + extract: direct fetch from a loopback site, the Jina Reader API shape, the address
guard, and the extraction model over the OpenAI API."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import mcp
import pytest
from fake_openai import FakeOpenAI, Reply
from fake_site import Site

from nanbeige.servers.scrape import build_server
from nanbeige.tools.egress import BlockedAddress, FetchError, FetchPolicy, resolve_host
from nanbeige.tools.fetch import fetch_direct
from nanbeige.tools.scrape import (
    EXTRACTION_ENDPOINT,
    ScrapeConfig,
    ScrapeError,
    scrape_and_extract_info,
    scrape_config_from_env,
)

pytestmark = pytest.mark.anyio


def extractor(request: dict) -> Reply:
    """The extraction model: answers from the page it was shown, and complains when it is too long."""
    prompt = request["messages"][0]["content"]
    if len(prompt) > 6000:
        return Reply(status=400, body={"error": {"message": "This model's maximum context length is 2048 tokens"}})
    page = prompt.split("## Page content\n", 1)[1]
    facts = [line.strip() for line in page.splitlines() if "687" in line or "Phobos" in line or "moons" in line]
    return Reply(content="<think>\nLooking.\n</think>\n\n" + (" ".join(facts) or "Nothing relevant."))


def config(summary_url: str, **overrides: object) -> ScrapeConfig:
    summary = replace(EXTRACTION_ENDPOINT, base_url=summary_url, model="extractor", retry_wait_s=0.01)
    return ScrapeConfig(summary=summary, retry_wait_s=0.01, policy=FetchPolicy(allow_private=True), **overrides)


async def test_an_html_page_is_cleaned_and_the_asked_information_extracted() -> None:
    with Site() as site, FakeOpenAI(extractor) as model:
        result = await scrape_and_extract_info(
            site.url("/article"), "How long is a year on Mars?", None, config(model.base_url)
        )
    prompt = model.requests[0]["messages"][0]["content"]
    assert "687 Earth days" in prompt and "How long is a year on Mars?" in prompt
    assert "BUY CHEAP TELESCOPES" not in prompt and "Privacy" not in prompt  # navigation and ads are gone
    assert result["success"] and "687 Earth days" in result["extracted_info"]
    assert "Looking." not in result["extracted_info"]  # the extractor's reasoning is dropped
    assert result["scrape_stats"]["all_content_displayed"] is True
    assert result["model_used"] == "extractor" and result["tokens_used"] > 0


@pytest.mark.parametrize(
    ("model_name", "settings"),
    [
        ("extractor", {"max_tokens": 8192, "temperature": 1.0}),  # and no top_p: the reference sent none
        ("gpt-4.1-mini", {"max_completion_tokens": 8192}),  # OpenAI's models: no sampling settings at all
    ],
)
async def test_the_extraction_request_samples_as_the_reference_did(model_name: str, settings: dict) -> None:
    with Site() as site, FakeOpenAI(extractor) as model:
        cfg = config(model.base_url)
        await scrape_and_extract_info(
            site.url("/article"),
            "How long is a year on Mars?",
            None,
            replace(cfg, summary=replace(cfg.summary, model=model_name)),
        )
    request = model.requests[0]
    assert set(request) - {"_headers", "_received"} == {"model", "messages", *settings}  # less what the fake adds
    assert request["model"] == model_name and {k: request[k] for k in settings} == settings


async def test_a_pdf_becomes_text() -> None:
    with Site() as site, FakeOpenAI(extractor) as model:
        result = await scrape_and_extract_info(
            site.url("/paper.pdf"), "Orbital period of Phobos?", None, config(model.base_url)
        )
    assert "Phobos orbits Mars in 7 hours and 39 minutes." in result["extracted_info"]


async def test_a_page_too_long_for_the_extractor_is_cut_and_retried() -> None:
    with Site() as site, FakeOpenAI(extractor) as model:
        result = await scrape_and_extract_info(
            site.url("/long.txt"), "seasons", None, config(model.base_url, trim_step_chars=8000)
        )
    stats = result["scrape_stats"]
    assert len(model.requests) > 1 and stats["all_content_displayed"] is False
    assert stats["char_count"] > 20000 and stats["line_count"] == 401 and stats["last_char_line"] < 400


async def test_custom_headers_reach_the_site() -> None:
    with Site() as site, FakeOpenAI(extractor) as model:
        await scrape_and_extract_info(site.url("/article"), "x", {"X-Token": "abc"}, config(model.base_url))
    assert site.requests[0][1]["X-Token"] == "abc"


async def test_errors_the_model_can_act_on() -> None:
    with Site() as site, FakeOpenAI(extractor) as model:
        with pytest.raises(FetchError, match="HTTP 404"):
            await scrape_and_extract_info(site.url("/missing"), "x", None, config(model.base_url))
        with pytest.raises(FetchError, match="Hugging Face"):
            await scrape_and_extract_info("https://huggingface.co/datasets/x/y", "x", None, config(model.base_url))
        with pytest.raises(FetchError, match="only http"):
            await scrape_and_extract_info("file:///etc/passwd", "x", None, config(model.base_url))


async def test_private_addresses_are_refused_directly_and_after_redirects() -> None:
    async def resolve(host: str) -> list[str]:  # test names; numeric forms through the system resolver
        table = {"docs.test": ["127.0.0.1"], "internal.test": ["10.1.2.3"], "meta.test": ["169.254.169.254"]}
        return table.get(host) or await resolve_host(host)

    policy = FetchPolicy(allowed_hosts=frozenset({"docs.test"}), resolve=resolve)
    with Site() as site:
        assert "Orbit of Mars" in (await fetch_direct(site.url("/article", "docs.test"), policy)).text
        for target in (
            site.url("/article"),
            "http://internal.test/",
            "http://meta.test/latest/meta-data",
            "http://[::1]:1/",
            "http://0x7f000001/",
        ):
            with pytest.raises(BlockedAddress, match="not a public address"):
                await fetch_direct(target, policy)
            with pytest.raises(BlockedAddress):  # the same target reached through a redirect
                await fetch_direct(site.url(f"/redirect?to={target}", "docs.test"), policy)
    assert not any(path == "/article" for path, _ in site.requests[1:]), "a refused address was contacted"


async def test_jina_reader_is_used_with_the_key_and_retried_on_overload() -> None:
    async def resolve(host: str) -> list[str]:
        return ["93.184.216.34"]

    with Site() as site, FakeOpenAI(extractor) as model:
        site.jina_statuses = [429, 503]
        cfg = config(model.base_url, backend="jina", jina_api_key="jina-key", jina_base_url=site.url("/jina"))
        cfg.policy = FetchPolicy(resolve=resolve)
        result = await scrape_and_extract_info("https://example.org/mars", "moons", None, cfg)
    jina_calls = [(path, headers) for path, headers in site.requests if path.startswith("/jina/")]
    assert len(jina_calls) == 3 and jina_calls[-1][0] == "/jina/https://example.org/mars"
    assert jina_calls[-1][1]["Authorization"] == "Bearer jina-key"
    assert "Mars has two moons." in result["extracted_info"]


async def test_jina_key_and_balance_problems_name_the_fix() -> None:
    async def resolve(host: str) -> list[str]:
        return ["93.184.216.34"]

    for status, fix in ((401, "check JINA_API_KEY"), (402, "NANBEIGE_SCRAPE_BACKEND=direct")):
        with Site() as site:
            site.jina_statuses = [status]
            cfg = ScrapeConfig(
                backend="jina", jina_api_key="k", jina_base_url=site.url("/jina"), policy=FetchPolicy(resolve=resolve)
            )
            with pytest.raises(ScrapeError, match=fix):
                await scrape_and_extract_info("https://example.org/", "x", None, cfg)
            assert len(site.requests) == 1  # never retried


async def test_an_unreachable_extraction_model_names_the_setting() -> None:
    with Site() as site:
        cfg = config("http://127.0.0.1:9/v1")
        with pytest.raises(ScrapeError, match="NANBEIGE_SUMMARY_BASE_URL"):
            await scrape_and_extract_info(site.url("/article"), "x", None, cfg)


def test_settings_from_the_environment() -> None:
    cfg = scrape_config_from_env(
        {
            "JINA_API_KEY": "k",
            "NANBEIGE_BASE_URL": "http://h:1/v1",
            "NANBEIGE_MODEL": "m",
            "NANBEIGE_ALLOWED_HOSTS": "Docs.Test, wiki.local",
        }
    )
    assert (cfg.backend, cfg.summary.base_url, cfg.summary.model) == ("jina", "http://h:1/v1", "m")
    assert cfg.policy.allowed_hosts == {"docs.test", "wiki.local"} and not cfg.policy.allow_private
    assert (
        scrape_config_from_env(
            {
                "NANBEIGE_SUMMARY_BASE_URL": "http://s/v1",
                "NANBEIGE_BASE_URL": "http://h/v1",
                "NANBEIGE_ALLOW_PRIVATE_URLS": "1",
            }
        ).summary.base_url
        == "http://s/v1"
    )
    assert scrape_config_from_env({}).backend == "direct"
    with pytest.raises(ScrapeError, match="needs JINA_API_KEY"):
        scrape_config_from_env({"NANBEIGE_SCRAPE_BACKEND": "jina"})


async def test_the_server_in_process_returns_json_and_tool_errors() -> None:
    with Site() as site, FakeOpenAI(extractor) as model:
        async with mcp.Client(build_server(config(model.base_url))) as client:
            ok = await client.call_tool(
                "scrape_and_extract_info", {"url": site.url("/article"), "info_to_extract": "year length"}
            )
            missing = await client.call_tool(
                "scrape_and_extract_info", {"url": site.url("/gone"), "info_to_extract": "x"}
            )
    assert not ok.is_error and json.loads(ok.content[0].text)["success"] is True
    failed = json.loads(missing.content[0].text)  # the same JSON object, as the reference's server answers
    assert not missing.is_error and failed["success"] is False and failed["url"] == site.url("/gone")
    assert failed["error"].startswith("Scraping failed: ") and "HTTP 404" in failed["error"]
    assert (failed["extracted_info"], failed["scrape_stats"], failed["tokens_used"]) == ("", {}, 0)


async def test_the_server_as_a_stdio_subprocess() -> None:
    with Site() as site, FakeOpenAI(extractor) as model:
        params = mcp.StdioServerParameters(
            command=sys.executable,
            args=["-m", "nanbeige.servers.scrape"],
            env={"NANBEIGE_SUMMARY_BASE_URL": model.base_url, "NANBEIGE_ALLOW_PRIVATE_URLS": "1"},
        )
        async with mcp.Client(params) as client:
            [tool] = (await client.list_tools()).tools
            result = await client.call_tool(
                "scrape_and_extract_info", {"url": site.url("/paper.pdf"), "info_to_extract": "Phobos"}
            )
    assert tool.name == "scrape_and_extract_info" and set(tool.input_schema["required"]) == {"url", "info_to_extract"}
    assert "7 hours and 39 minutes" in json.loads(result.content[0].text)["extracted_info"]


async def test_the_reader_prefix_and_ipv6_translation_ranges_do_not_get_round_the_guard() -> None:
    async def resolve(host: str) -> list[str]:
        return {"nat64.test": ["64:ff9b::a9fe:a9fe"], "sixtofour.test": ["2002:7f00:1::"]}.get(
            host
        ) or await resolve_host(host)

    policy = FetchPolicy(resolve=resolve)
    for target in ("http://nat64.test/", "http://sixtofour.test/", "http://[::7f00:1]/", "http://[::ffff:0:7f00:1]/"):
        with pytest.raises(BlockedAddress):
            await fetch_direct(target, policy)
    with Site() as site:
        cfg = ScrapeConfig(backend="jina", jina_api_key="k", jina_base_url=site.url("/jina"), policy=policy)
        with pytest.raises(BlockedAddress):
            await scrape_and_extract_info("https://r.jina.ai/http://10.0.0.5/admin", "x", None, cfg)
        with pytest.raises(FetchError, match="Hugging Face"):
            await scrape_and_extract_info("https://HuggingFace.co/datasets/a/b", "x", None, cfg)
    assert site.requests == []  # nothing reached the reader


async def test_the_models_headers_never_replace_the_reader_key() -> None:
    async def resolve(host: str) -> list[str]:
        return ["93.184.216.34"]

    with Site() as site, FakeOpenAI(extractor) as model:
        cfg = config(model.base_url, backend="jina", jina_api_key="jina-key", jina_base_url=site.url("/jina"))
        cfg.policy = FetchPolicy(resolve=resolve)
        await scrape_and_extract_info("https://example.org/mars", "moons", {"Authorization": "Bearer other"}, cfg)
    assert site.requests[0][1]["Authorization"] == "Bearer jina-key"
