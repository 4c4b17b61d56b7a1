"""google_search's backends besides Serper: a loopback SearXNG fake and a small local index (reloaded when
rebuilt); and which backend the environment chooses, or what it says is missing when none is set up."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_search_apis import FakeSearXNG, Reply

from nanbeige.tools.index import build_index
from nanbeige.tools.search import Searcher, SearchError, google_search
from nanbeige.tools.search_config import (
    SearchConfig,
    SearchUnavailable,
    choose_backend,
    config_from_env,
    search_setup_problem,
)

pytestmark = pytest.mark.anyio


def searxng(api: FakeSearXNG, tmp_path: Path) -> SearchConfig:
    return SearchConfig(searxng_url=api.url, index_dir=tmp_path / "none", retry_wait_s=0.01, max_attempts=3)


async def test_searxng_request_and_mapping(tmp_path: Path) -> None:
    results = {
        "moon landing": [
            {
                "title": "Apollo 11",
                "link": "https://en.wikipedia.org/wiki/Apollo_11",
                "snippet": "First crewed landing.",
                "date": "2024-07-20T00:00:00",
            },
            {"title": "NASA", "link": "https://huggingface.co/datasets/nasa", "snippet": "hub"},
            {"title": "Luna", "link": "https://ru.wikipedia.org/wiki/%D0%9B%D1%83%D0%BD%D0%B0", "snippet": None},
        ]
    }
    with FakeSearXNG(results=results) as api:
        result = await google_search("moon landing", gl="gb", tbs="qdr:w", page=2, config=searxng(api, tmp_path))
    assert api.requests[0].method == "GET" and api.requests[0].path == "/search"
    assert api.requests[0].params == {
        "q": "moon landing",
        "format": "json",
        "pageno": "2",
        "language": "en-GB",
        "time_range": "week",
    }
    assert result["organic"] == [
        {
            "title": "Apollo 11",
            "link": "https://en.wikipedia.org/wiki/Apollo_11",
            "snippet": "First crewed landing.",
            "date": "2024-07-20",
            "position": 1,
        },
        {"title": "Luna", "link": "https://ru.wikipedia.org/wiki/Луна", "snippet": "", "position": 3},
    ]
    assert result["searchParameters"]["engine"] == "searxng" and result["searchParameters"]["page"] == 2


@pytest.mark.parametrize(
    ("tbs", "time_range"), [("qdr:h", "day"), ("qdr:d", "day"), ("qdr:m", "month"), ("qdr:y", "year")]
)
async def test_searxng_time_ranges(tmp_path: Path, tbs: str, time_range: str) -> None:
    with FakeSearXNG() as api:
        await google_search("q", hl="zh-cn", tbs=tbs, config=searxng(api, tmp_path))
    assert api.requests[0].params["time_range"] == time_range and api.requests[0].params["language"] == "zh-cn"


async def test_searxng_num_quotes_and_errors(tmp_path: Path) -> None:
    with FakeSearXNG(count=30) as api:
        assert len((await google_search("q", config=searxng(api, tmp_path)))["organic"]) == 10
        assert len((await google_search("q", num=25, config=searxng(api, tmp_path)))["organic"]) == 25
        with pytest.raises(SearchError, match=r"no results .*engines that failed: google: timeout"):
            await google_search('"nothing" found', config=searxng(api, tmp_path))
        with pytest.raises(SearchError, match="no custom date ranges"):
            await google_search("q", tbs="cdr:1,cd_min:1/1/2020,cd_max:2/1/2020", config=searxng(api, tmp_path))
    assert [r.params["q"] for r in api.requests] == ["q", "q", '"nothing" found', "nothing found"]
    with FakeSearXNG([Reply(403, "Forbidden")]) as api:
        with pytest.raises(SearchUnavailable, match="enable `json` under search.formats"):
            await google_search("q", config=searxng(api, tmp_path))
    with FakeSearXNG([Reply(429, "slow down", {"Retry-After": "0"}), Reply(502, "bad gateway")]) as api:
        assert (await google_search("q", config=searxng(api, tmp_path)))["organic"]


# ---------------------------------------------------------------- local index


@pytest.fixture
def small_index(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "otters.md").write_text("# Sea otters\n\nSea otters hold hands while sleeping so they do not drift.")
    (docs / "kelp.txt").write_text("Kelp forests\n\nKelp forests shelter sea otters and many fish.")
    build_index([docs], tmp_path / "index")
    return tmp_path / "index"


async def test_local_backend(small_index: Path) -> None:
    config = SearchConfig(backend="local", index_dir=small_index)
    result = await google_search("sea otters sleeping", config=config)
    assert [r["title"] for r in result["organic"]] == ["Sea otters", "Kelp forests"]
    assert result["organic"][0]["link"].startswith("file:///") and result["organic"][0]["link"].endswith("otters.md")
    assert "hold hands" in result["organic"][0]["snippet"]
    assert result["searchParameters"]["engine"] == "local"
    second = await google_search("sea otters", num=1, page=2, config=config)
    assert [(r["title"], r["position"]) for r in second["organic"]] == [("Kelp forests", 2)]
    quoted = await google_search('"otters sleeping"', config=config)  # no such phrase: retried without quotes
    assert quoted["organic"][0]["title"] == "Sea otters"
    assert (await google_search("volcano", config=config))["organic"] == []


async def test_searcher_reloads_a_rebuilt_index(small_index: Path, tmp_path: Path) -> None:
    async with Searcher(SearchConfig(backend="local", index_dir=small_index)) as searcher:
        assert (await searcher.google_search("otters"))["organic"]
        (tmp_path / "new.txt").write_text("Volcanoes\n\nBasalt lava is runny.")
        build_index([tmp_path / "new.txt"], small_index)
        assert (await searcher.google_search("basalt"))["organic"][0]["title"] == "Volcanoes"
        assert (await searcher.google_search("otters"))["organic"] == []


# ---------------------------------------------------------------- choosing a backend


def test_backend_choice_from_env(tmp_path: Path, small_index: Path) -> None:
    base = {"XDG_DATA_HOME": str(tmp_path / "xdg")}
    assert config_from_env(base).index_dir == tmp_path / "xdg/nanbeige/index"
    both = {**base, "SERPER_API_KEY": "k", "SEARXNG_URL": "http://127.0.0.1:1"}
    assert choose_backend(config_from_env(both)) == "serper"
    assert choose_backend(config_from_env({**base, "SEARXNG_URL": "http://127.0.0.1:1"})) == "searxng"
    assert choose_backend(config_from_env({**base, "NANBEIGE_INDEX": str(small_index)})) == "local"
    assert choose_backend(config_from_env({**both, "NANBEIGE_SEARCH_BACKEND": "searxng"})) == "searxng"
    assert config_from_env({**base, "SERPER_BASE_URL": "http://proxy"}).serper_base_url == "http://proxy"
    problem = search_setup_problem(config_from_env(base))
    assert problem and all(
        s in problem
        for s in (
            "SERPER_API_KEY",
            "SEARXNG_URL",
            "nanbeige index build",
            str(tmp_path / "xdg/nanbeige/index"),
            "NANBEIGE_INDEX",
        )
    )
    with pytest.raises(SearchUnavailable, match="no search backend is configured"):
        choose_backend(config_from_env(base))
    assert search_setup_problem(config_from_env(both)) is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NANBEIGE_SEARCH_BACKEND": "bing"}, "'bing' is not one of serper, searxng, local"),
        ({"NANBEIGE_SEARCH_BACKEND": "serper", "SEARXNG_URL": "http://x"}, "needs SERPER_API_KEY"),
        ({"NANBEIGE_SEARCH_BACKEND": "searxng"}, "needs SEARXNG_URL"),
        (
            {"NANBEIGE_SEARCH_BACKEND": "local", "SERPER_API_KEY": "k"},
            "no local search index in .*nanbeige index build",
        ),
    ],
)
def test_backend_misconfigured(tmp_path: Path, env: dict[str, str], message: str) -> None:
    problem = search_setup_problem(config_from_env({"XDG_DATA_HOME": str(tmp_path), **env}))
    assert problem is not None
    with pytest.raises(SearchUnavailable, match=message):
        choose_backend(config_from_env({"XDG_DATA_HOME": str(tmp_path), **env}))
