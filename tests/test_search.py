"""google_search against a loopback Serper fake; the MCP server in process and as a stdio subprocess. The other
backends (SearXNG, a local index) and the choice among them are tests/test_search_backends.py."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import mcp
import pytest
from conftest import free_port
from fake_search_apis import (
    NO_CREDITS,
    RATE_LIMITED,
    SERVER_ERROR,
    UNAUTHORIZED,
    FakeSerper,
    Reply,
)

from nanbeige.servers.search import build_server
from nanbeige.tools.results import decode_percent, decode_strings
from nanbeige.tools.search import SearchError, google_search
from nanbeige.tools.search_config import (
    SearchConfig,
    SearchUnavailable,
)

pytestmark = pytest.mark.anyio
PARAMETERS = ["q", "gl", "hl", "location", "num", "tbs", "page", "autocorrect"]


def serper(api: FakeSerper, tmp_path: Path, **kw: object) -> SearchConfig:
    return SearchConfig(
        serper_api_key="test-key",
        serper_base_url=api.url,
        index_dir=tmp_path / "none",
        retry_wait_s=0.01,
        max_attempts=3,
        **kw,
    )  # type: ignore[arg-type]


# ---------------------------------------------------------------- Serper


async def test_serper_request_and_result_shape(tmp_path: Path) -> None:
    with FakeSerper() as api:
        result = await google_search("large language models", config=serper(api, tmp_path))
    request = api.requests[0]
    assert request.method == "POST" and request.path == "/search" and request.headers["X-API-KEY"] == "test-key"
    assert request.body == {"q": "large language models", "gl": "us", "hl": "en", "num": 10}
    assert set(result) == {"organic", "searchParameters"}  # knowledge graph, PAA, related searches dropped
    assert len(result["organic"]) == 10
    first = result["organic"][0]
    assert first == {
        "title": "large language models - page 1",
        "link": "https://example.com/large-language-models/1",
        "snippet": "Page 1 about large language models.",
        "position": 1,
    }
    assert result["searchParameters"]["q"] == "large language models"


@pytest.mark.parametrize(("num", "expected"), [(None, 10), (3, 3), (40, 15)])
async def test_num_defaults_to_ten(tmp_path: Path, num: int | None, expected: int) -> None:
    with FakeSerper() as api:
        result = await google_search("q", num=num, config=serper(api, tmp_path))
    assert len(result["organic"]) == expected
    assert api.requests[0].body["num"] == (num or 10)


async def test_optional_arguments_are_sent_only_when_given(tmp_path: Path) -> None:
    with FakeSerper() as api:
        await google_search(
            "q",
            gl="de",
            hl="de",
            location="Berlin, Germany",
            tbs="qdr:w",
            page=2,
            autocorrect=False,
            config=serper(api, tmp_path),
        )
    assert api.requests[0].body == {
        "q": "q",
        "gl": "de",
        "hl": "de",
        "location": "Berlin, Germany",
        "num": 10,
        "tbs": "qdr:w",
        "page": 2,
        "autocorrect": False,
    }


async def test_quoted_query_retried_once_without_quotes(tmp_path: Path) -> None:
    results = {"Nanbeige 3B": [{"title": "Nanbeige", "link": "https://example.com/n", "snippet": "s"}]}
    with FakeSerper(results=results) as api:
        result = await google_search('"Nanbeige" 3B', config=serper(api, tmp_path))
    assert [r.body["q"] for r in api.requests] == ['"Nanbeige" 3B', "Nanbeige 3B"]
    assert result["organic"][0]["link"] == "https://example.com/n"


async def test_no_results_is_an_empty_organic_list(tmp_path: Path) -> None:
    with FakeSerper() as api:  # as the reference's server answered: not an error, just nothing found
        assert await google_search("nothing here", config=serper(api, tmp_path)) == {
            "organic": [],
            "searchParameters": {
                "q": "nothing here",
                "gl": "us",
                "hl": "en",
                "num": 10,
                "type": "search",
                "engine": "google",
            },
        }
        assert (await google_search('"nothing" at all', config=serper(api, tmp_path)))["organic"] == []
    assert [r.body["q"] for r in api.requests] == ["nothing here", '"nothing" at all', "nothing at all"]


async def test_serper_items_are_passed_on_whole(tmp_path: Path) -> None:
    """Every field Serper sent, in its order, as the reference's server passed them on; nothing cut
    to `num` (Serper already sent that many)."""
    item = {
        "title": "Mars",
        "link": "https://en.wikipedia.org/wiki/Mars",
        "snippet": "The fourth planet.",
        "date": "Mar 3, 2024",
        "sitelinks": [{"title": "Moons", "link": "https://en.wikipedia.org/wiki/Moons"}],
        "attributes": {"Distance": "225 million km"},
        "rating": 4.5,
        "ratingCount": 12,
        "position": 1,
    }
    body = {
        "searchParameters": {"q": "mars", "type": "search"},
        "organic": [item, {"title": "no link"}, "odd"],
        "knowledgeGraph": {"title": "Mars"},
        "answerBox": {"answer": "Mars"},
        "credits": 1,
    }
    with FakeSerper([Reply(200, body)]) as api:
        result = await google_search("mars", num=1, config=serper(api, tmp_path))
    assert result == {"organic": [item, {"title": "no link"}, "odd"], "searchParameters": body["searchParameters"]}
    assert list(result["organic"][0]) == list(item)


async def test_hub_links_are_dropped(tmp_path: Path) -> None:
    # the reference's test: these substrings, case as written, in the link as Serper sent it
    links = [
        "https://huggingface.co/datasets/x/y",
        "https://www.huggingface.co/spaces/a/b",
        "https://www.unifuncs.com/s",
        "https://HuggingFace.co/datasets/x/y",
        "https://huggingface.co/Nanbeige/Nanbeige4.1-3B",
        "https://example.com/ok",
    ]
    results = {"hub": [{"title": str(n), "link": link, "snippet": ""} for n, link in enumerate(links)]}
    with FakeSerper(results=results) as api:
        result = await google_search("hub", config=serper(api, tmp_path))
    assert [r["link"] for r in result["organic"]] == links[2:]


async def test_every_string_with_a_percent_is_decoded(tmp_path: Path) -> None:
    sitelink = {"title": "s", "link": "https://zh.wikipedia.org/wiki/%E5%92%96%E5%95%A1"}
    results = {
        "cafe 100%": [
            {
                "title": "Caf%C3%A9",
                "link": "https://fr.wikipedia.org/wiki/Caf%C3%A9_%28boisson%29",
                "snippet": "50% off, a%2Fb",
                "sitelinks": [sitelink],
            }
        ]
    }
    with FakeSerper(results=results) as api:
        result = await google_search("cafe 100%", config=serper(api, tmp_path))
    assert result["organic"][0] == {
        "title": "Café",
        "link": "https://fr.wikipedia.org/wiki/Café_(boisson)",
        "snippet": "50% off, a%2Fb",
        "sitelinks": [{"title": "s", "link": "https://zh.wikipedia.org/wiki/咖啡"}],
        "position": 1,
    }
    assert result["searchParameters"]["q"] == "cafe 100%"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("https://de.wikipedia.org/wiki/M%C3%BCnchen", "https://de.wikipedia.org/wiki/München"),
        # the escapes the reference kept: / ? # & = space + % (and %2f %3f in lower case, uppercased)
        ("https://x.org/a%2Fb?q=1%262&r=%3D#%23%20%2B%25", "https://x.org/a%2Fb?q=1%262&r=%3D#%23%20%2B%25"),
        ("https://x.org/a%2fb%3fc", "https://x.org/a%2Fb%3Fc"),
        ("https://x.org/a%3db%2bc%28%29%7E", "https://x.org/a=b+c()~"),  # lower-case %3d and %2b are decoded
        ("https://x.org/%FF%E4%B8%AD", "https://x.org/中"),  # bytes that are not UTF-8 are dropped
        ("https://x.org/%E4%B8%2F%AD", "https://x.org/%2F"),  # a character cut by a kept escape: both halves dropped
        ("https://x.org/%e2%80%8b", "https://x.org/\u200b"),  # an invisible character too is decoded
        ("100% sure, %zz and %", "100% sure, %zz and %"),  # not escapes: left as they are
        ("%252F", "%252F"),  # decoded once: %25 is kept, so no new escape appears
        ("https://x.org/plain", "https://x.org/plain"),
    ],
)
def test_decode_percent(text: str, expected: str) -> None:
    assert decode_percent(text) == expected


def test_decoding_walks_dict_values_and_lists_only() -> None:
    value = {"a%C3%A9": ["%C3%A9", {"k": "%C3%A9"}], "n": 5, "f": 1.5, "none": None, "t": ("%C3%A9",)}
    assert decode_strings(value) == {"a%C3%A9": ["é", {"k": "é"}], "n": 5, "f": 1.5, "none": None, "t": ("%C3%A9",)}


async def test_serper_answers_missing_pieces(tmp_path: Path) -> None:
    body = {"organic": [{"title": None, "link": "https://a.org", "snippet": None}]}  # no searchParameters
    with FakeSerper([Reply(200, body)]) as api:
        result = await google_search("q", config=serper(api, tmp_path))
    assert result == {"organic": body["organic"], "searchParameters": {}}  # as the reference answered
    with FakeSerper([Reply(200, {"organic": None}), Reply(200, [1, 2])]) as api:
        assert (await google_search("q", config=serper(api, tmp_path)))["organic"] == []
        with pytest.raises(SearchUnavailable, match="not a JSON object"):
            await google_search("q", config=serper(api, tmp_path))


async def test_429_is_retried_after_retry_after(tmp_path: Path) -> None:
    with FakeSerper([RATE_LIMITED]) as api:
        started = time.perf_counter()
        result = await google_search("q", config=serper(api, tmp_path))
    assert time.perf_counter() - started >= 1.0 and len(api.requests) == 2 and result["organic"]


async def test_5xx_retried_then_reported(tmp_path: Path) -> None:
    with FakeSerper([SERVER_ERROR, Reply(500, {"message": "boom"})]) as api:
        assert (await google_search("q", config=serper(api, tmp_path)))["organic"]
    assert len(api.requests) == 3
    with FakeSerper([SERVER_ERROR] * 3) as api:
        with pytest.raises(SearchUnavailable, match=r"Serper failed \(HTTP 503 after 3 attempts"):
            await google_search("q", config=serper(api, tmp_path))
    assert len(api.requests) == 3


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (NO_CREDITS, "out of credits .*Not enough credits"),
        (Reply(402, {"message": "Payment required"}), "out of credits"),
        (UNAUTHORIZED, r"rejected the API key \(HTTP 403: Unauthorized.\); check SERPER_API_KEY"),
        (Reply(401, {"message": "Invalid API key"}), "check SERPER_API_KEY"),
    ],
)
async def test_key_and_credit_errors_are_not_retried(tmp_path: Path, reply: Reply, message: str) -> None:
    with FakeSerper([reply]) as api:
        with pytest.raises(SearchUnavailable, match=message):
            await google_search("q", config=serper(api, tmp_path))
    assert len(api.requests) == 1


async def test_wrong_key_reaches_the_fake_as_403(tmp_path: Path) -> None:
    with FakeSerper(api_key="other") as api:
        with pytest.raises(SearchUnavailable, match="SERPER_API_KEY"):
            await google_search("q", config=serper(api, tmp_path))


async def test_other_400_is_for_the_model(tmp_path: Path) -> None:
    with FakeSerper([Reply(400, {"message": "Invalid gl", "statusCode": 400})]) as api:
        with pytest.raises(SearchError, match="Invalid gl.*two-letter country code"):
            await google_search("q", gl="usa", config=serper(api, tmp_path))


async def test_unreachable_and_slow_services(tmp_path: Path) -> None:
    config = SearchConfig(
        serper_api_key="k",
        serper_base_url=f"http://127.0.0.1:{free_port()}",
        index_dir=tmp_path,
        retry_wait_s=0.01,
        max_attempts=2,
    )
    with pytest.raises(SearchUnavailable, match="cannot reach Serper at http://127.0.0.1.*SERPER_BASE_URL"):
        await google_search("q", config=config)
    config = SearchConfig(searxng_url=f"http://127.0.0.1:{free_port()}", index_dir=tmp_path, retry_wait_s=0.01)
    with pytest.raises(SearchUnavailable, match="cannot reach SearXNG .*check SEARXNG_URL and that SearXNG is running"):
        await google_search("q", config=config)
    with FakeSerper([Reply(delay_s=1.0)] * 2) as api:
        config = serper(api, tmp_path, timeout_s=0.2)
        config.max_attempts = 2
        with pytest.raises(SearchUnavailable, match="did not answer in 0.2 s"):
            await google_search("q", config=config)
    assert len(api.requests) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"q": "  "}, "q is empty"),
        ({"q": "x", "num": 0}, "num must be between 1 and 100"),
        ({"q": "x", "num": 101}, "num must be between 1 and 100"),
        ({"q": "x", "page": 0}, "page numbers start at 1"),
        ({"q": "x", "tbs": "yesterday"}, "qdr:h .* qdr:y"),
    ],
)
async def test_bad_arguments_are_refused_before_any_request(tmp_path: Path, kwargs: dict, message: str) -> None:
    with FakeSerper() as api:
        with pytest.raises(SearchError, match=message):
            await google_search(**kwargs, config=serper(api, tmp_path))
    assert api.requests == []


# ---------------------------------------------------------------- the MCP server


async def test_server_in_process(tmp_path: Path) -> None:
    with FakeSerper() as api:
        async with mcp.Client(build_server(serper(api, tmp_path))) as client:
            tools = (await client.list_tools()).tools
            assert [t.name for t in tools] == ["google_search"]
            assert list(tools[0].input_schema["properties"]) == PARAMETERS
            assert tools[0].input_schema["required"] == ["q"]
            assert all(f"qdr:{x}" in tools[0].description for x in "hdwmy")
            result = await client.call_tool("google_search", {"q": "otters", "num": 2})
            assert not result.is_error
            payload = json.loads(result.content[0].text)
            assert [r["position"] for r in payload["organic"]] == [1, 2]
            empty = await client.call_tool("google_search", {"q": "nothing at all"})
            assert not empty.is_error and json.loads(empty.content[0].text)["organic"] == []
            failed = await client.call_tool("google_search", {"q": "  "})
            assert not failed.is_error  # a JSON object saying what failed, as the reference's server answers
            assert json.loads(failed.content[0].text) == {
                "success": False,
                "results": [],
                "error": "q is empty: give the words to search for",
            }
            assert failed.content[0].text.startswith('{\n  "success": false')  # printed with a 2-space indent
            bad = await client.call_tool("google_search", {"q": "x", "num": "many"})
            assert bad.is_error and "num" in bad.content[0].text
    async with mcp.Client(build_server(SearchConfig(index_dir=tmp_path / "none"))) as client:
        failed = await client.call_tool("google_search", {"q": "otters"})
        assert "no search backend is configured" in json.loads(failed.content[0].text)["error"]


async def test_server_over_stdio(tmp_path: Path) -> None:
    with FakeSerper() as api:
        env = {"SERPER_API_KEY": "test-key", "SERPER_BASE_URL": api.url, "XDG_DATA_HOME": str(tmp_path)}
        params = mcp.StdioServerParameters(command=sys.executable, args=["-m", "nanbeige.servers.search"], env=env)
        with open(tmp_path / "stderr.txt", "w") as errlog:
            async with mcp.Client(mcp.stdio_client(params, errlog=errlog)) as client:
                await client.list_tools()
                result = await client.call_tool("google_search", {"q": "sea otters", "num": 3})
    assert not result.is_error
    assert [r["title"] for r in json.loads(result.content[0].text)["organic"]] == [
        "sea otters - page 1",
        "sea otters - page 2",
        "sea otters - page 3",
    ]
    assert api.requests[0].headers["X-API-KEY"] == "test-key"
