"""Web search for the agent: `google_search`, answered by Serper, SearXNG or a local index.

Whatever the backend, the result has Serper's shape, the one the model was trained on:
`{"organic": [{"title", "link", "snippet", ...}], "searchParameters": {...}}`, Serper's other blocks
(knowledge graph, people also ask, related searches, credits) left out, as its training harness
(MiroThinker v1.0's `search_and_scrape_webpage` server) did. From that harness too: Serper's items
passed on whole, one retry without quotes when a quoted query finds nothing, no links into Hugging
Face datasets or spaces, and percent-escapes decoded in every string (`results.decode_percent`).
Which backend answers, and how it is reached, is `search_config.py`'s.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import re
import time
from typing import Any

import httpx
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_combine,
    wait_exception,
    wait_exponential_jitter,
)

from nanbeige.tools import paid_units
from nanbeige.tools.index import META_FILE, IndexNotFound, LocalIndex
from nanbeige.tools.results import decode_strings, organic, serper_organic
from nanbeige.tools.search_config import SearchConfig, SearchUnavailable, choose_backend, config_from_env
from nanbeige.tools.wire import answer_within

log = logging.getLogger(__name__)

DEFAULT_NUM = 10
RETRY_STATUSES = {408, 425, 429, 500, 502, 503, 504}
MAX_SEARCH_BYTES = 16 * 2**20
"""The longest answer of a search engine: a page of results is a few hundred KB at most."""
TBS = re.compile(r"qdr:[hdwmy]\d*|cdr:1,cd_min:[^,]+,cd_max:[^,]+")
TIME_RANGES = {"h": "day", "d": "day", "w": "week", "m": "month", "y": "year"}  # SearXNG has no "hour"
FIXES = {
    "Serper": "check your network, and SERPER_BASE_URL if you set it",
    "SearXNG": "check SEARXNG_URL and that SearXNG is running",
}
TBS_HELP = "qdr:h (past hour), qdr:d (day), qdr:w (week), qdr:m (month) or qdr:y (year)"


class SearchError(Exception):
    """The search failed in a way the model can act on: bad arguments, or nothing found."""


# ---------------------------------------------------------------- requests


def search_request(
    q: str,
    gl: str,
    hl: str,
    location: str | None,
    num: int | None,
    tbs: str | None,
    page: int | None,
    autocorrect: bool | None,
) -> dict[str, Any]:
    """The arguments checked and completed, as Serper's request body (None values left out)."""
    if not isinstance(q, str) or not q.strip():
        raise SearchError("q is empty: give the words to search for")
    num = DEFAULT_NUM if num is None else num
    if not 1 <= num <= 100:
        raise SearchError(f"num must be between 1 and 100 (got {num})")
    if page is not None and page < 1:
        raise SearchError(f"page numbers start at 1 (got {page})")
    if tbs is not None and not TBS.fullmatch(tbs.strip()):
        raise SearchError(f"tbs={tbs!r} is not a time filter; use {TBS_HELP}")
    body = {
        "q": q.strip(),
        "gl": gl,
        "hl": hl,
        "location": location,
        "num": num,
        "tbs": tbs.strip() if tbs else None,
        "page": page,
        "autocorrect": autocorrect,
    }
    return {k: v for k, v in body.items() if v is not None}


def search_parameters(request: dict[str, Any], engine: str) -> dict[str, Any]:
    return {**request, "type": "search", "engine": engine}


def format_results(result: dict[str, Any]) -> str:
    """The tool result text: the JSON as the reference's server printed it. Its tool returned a dict,
    which its MCP SDK (mcp 1.10) printed with `pydantic_core.to_json(indent=2)`: indented by 2 spaces,
    non-ASCII characters as themselves, keys in their order. json.dumps with these settings prints
    the same but for floats with an exponent (json.dumps writes 1e-07 where it wrote 1e-7), which
    search answers do not hold."""
    return json.dumps(result, ensure_ascii=False, indent=2)


# ---------------------------------------------------------------- HTTP with retries


class _RetryableStatus(Exception):
    def __init__(self, response: httpx.Response):
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def _retry_after(exc: BaseException) -> float:
    """Seconds the server asked us to wait (Retry-After as seconds or as a date), at most 60."""
    value = exc.response.headers.get("retry-after") if isinstance(exc, _RetryableStatus) else None
    if not value:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return 0.0
    return min(max(seconds, 0.0), 60.0)


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:300]
    message = body.get("message") or body.get("error") or body if isinstance(body, dict) else body
    return str(message)[:300]


# ---------------------------------------------------------------- the searcher


class Searcher:
    """Answers `google_search` from the configured backend. Holds the HTTP connection pool and,
    for the local backend, the loaded index (reloaded when it is rebuilt)."""

    def __init__(self, config: SearchConfig | None = None, transport: httpx.AsyncBaseTransport | None = None):
        self.config = config or config_from_env()
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(self.config.timeout_s, connect=10.0), transport=transport, follow_redirects=True
        )
        self._index: LocalIndex | None = None
        self._index_stamp: tuple[int, int] | None = None  # index.json's inode and mtime: a rebuild changes them

    async def __aenter__(self) -> Searcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def google_search(
        self,
        q: str,
        gl: str = "us",
        hl: str = "en",
        location: str | None = None,
        num: int | None = None,
        tbs: str | None = None,
        page: int | None = None,
        autocorrect: bool | None = None,
    ) -> dict[str, Any]:
        """Search; raises SearchError (the model can fix it) or SearchUnavailable (the user must)."""
        request = search_request(q, gl, hl, location, num, tbs, page, autocorrect)
        backend = choose_backend(self.config)
        result = await self._search(backend, request)
        unquoted = request["q"].replace('"', "").strip()
        if not result["organic"] and unquoted != request["q"] and unquoted:
            # exact phrases often match nothing; the model was trained with this second, looser try
            result = await self._search(backend, {**request, "q": unquoted})
        hint = result.pop("hint", "")
        if not result["organic"] and hint:  # the engines failed: not the same as a search that found nothing
            raise SearchError(f"no results for {request['q']!r}{hint}; try again later or with other keywords")
        # A search that finds nothing answers with an empty `organic` list, as the reference's server did;
        # decoded once, at the end, over the whole answer (searchParameters too), as it did.
        return decode_strings(result)

    async def _search(self, backend: str, request: dict[str, Any]) -> dict[str, Any]:
        if backend == "serper":
            return await self._serper(request)
        if backend == "searxng":
            return await self._searxng(request)
        return await self._local(request)

    async def _send(self, service: str, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """The answer, retrying connection errors, timeouts and 408/425/429/5xx; after the last
        attempt a retryable status comes back as it is, for the caller to explain."""
        c = self.config
        retrying = AsyncRetrying(
            retry=retry_if_exception(lambda e: isinstance(e, (_RetryableStatus, httpx.TransportError))),
            stop=stop_after_attempt(c.max_attempts) | stop_after_delay(c.max_retry_s),
            wait=wait_combine(
                wait_exponential_jitter(multiplier=c.retry_wait_s, max=10, jitter=c.retry_wait_s),
                wait_exception(_retry_after),
            ),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    request = self.http.build_request(method, url, **kwargs)
                    # whole within the timeout, headers included: an engine trickling them misses it
                    response = await answer_within(self.http, request, c.timeout_s, MAX_SEARCH_BYTES)
                    if response.status_code in RETRY_STATUSES:
                        log.info("%s answered HTTP %s; retrying", service, response.status_code)
                        raise _RetryableStatus(response)
                    return response
        except _RetryableStatus as exc:
            return exc.response
        except httpx.DecodingError as exc:
            raise SearchUnavailable(f"{service} at {url} sent an unreadable answer ({exc}); {FIXES[service]}") from None
        except httpx.TimeoutException:
            raise SearchUnavailable(
                f"{service} at {url} did not answer in {c.timeout_s:g} s ({c.max_attempts} attempts); {FIXES[service]}"
            ) from None
        except httpx.TransportError as exc:
            raise SearchUnavailable(
                f"cannot reach {service} at {url} ({type(exc).__name__}: {exc}); {FIXES[service]}"
            ) from None
        raise AssertionError("unreachable")

    async def _serper(self, request: dict[str, Any]) -> dict[str, Any]:
        c = self.config
        url = c.serper_base_url.rstrip("/") + "/search"
        headers = {"X-API-KEY": c.serper_api_key or "", "Content-Type": "application/json"}
        response = await self._send("Serper", "POST", url, json=request, headers=headers)
        _check_serper(response, c.max_attempts)
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise SearchUnavailable(f"Serper at {url} sent a reply that is not a JSON object; check SERPER_BASE_URL")
        credits = body.get("credits")
        paid_units.add("serper_queries", credits if isinstance(credits, (int, float)) and credits > 0 else 1)
        # Only these two blocks, and searchParameters as Serper sent it ({} when it sent none), as the
        # reference's server answered.
        return {"organic": serper_organic(body.get("organic")), "searchParameters": body.get("searchParameters", {})}

    async def _searxng(self, request: dict[str, Any]) -> dict[str, Any]:
        base = (self.config.searxng_url or "").rstrip("/")
        response = await self._send("SearXNG", "GET", base + "/search", params=searxng_params(request))
        _check_searxng(response, base, self.config.max_attempts)
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise SearchUnavailable(
                f"SearXNG at {base} did not send JSON; enable `json` under search.formats in its settings.yml"
            )
        results = body.get("results") if isinstance(body.get("results"), list) else []
        items = [
            {
                "title": r.get("title"),
                "link": r.get("url"),
                "snippet": r.get("content"),
                "date": _date(r.get("publishedDate")),
                "position": n,
            }
            for n, r in enumerate((r for r in results if isinstance(r, dict)), start=1)
        ]
        result = {"organic": organic(items, request["num"]), "searchParameters": search_parameters(request, "searxng")}
        failed = [e for e in body.get("unresponsive_engines") or [] if isinstance(e, list) and e]
        if failed:
            result["hint"] = " (SearXNG engines that failed: " + ", ".join(": ".join(map(str, e)) for e in failed) + ")"
        return result

    async def _local(self, request: dict[str, Any]) -> dict[str, Any]:
        index = await self._load_index()
        num, page = request["num"], request.get("page", 1)
        hits = await asyncio.to_thread(index.search, request["q"], num, (page - 1) * num)
        return {"organic": organic(hits, num), "searchParameters": search_parameters(request, "local")}

    async def _load_index(self) -> LocalIndex:
        path = self.config.index_dir
        try:
            stat = (path / META_FILE).stat()
            stamp = (stat.st_ino, stat.st_mtime_ns)
        except OSError:
            stamp = None
        if self._index is None or stamp != self._index_stamp:
            try:
                self._index = await asyncio.to_thread(LocalIndex.load, path)
            except IndexNotFound as exc:
                raise SearchUnavailable(str(exc)) from None
            self._index_stamp = stamp
        return self._index


def _check_serper(response: httpx.Response, attempts: int) -> None:
    status, message = response.status_code, _message(response)
    if status == 200:
        return
    if status in (401, 403):
        raise SearchUnavailable(f"Serper rejected the API key (HTTP {status}: {message}); check SERPER_API_KEY")
    if status == 402 or "credit" in message.lower():
        raise SearchUnavailable(
            f"the Serper account is out of credits (HTTP {status}: {message}); top up at "
            "https://serper.dev, or set SEARXNG_URL or NANBEIGE_SEARCH_BACKEND=local instead"
        )
    if status == 429:
        raise SearchUnavailable(
            f"Serper is rate-limiting this key (HTTP 429 after {attempts} attempts); "
            "try again later or run fewer searches at once"
        )
    if status >= 500 or status in RETRY_STATUSES:
        raise SearchUnavailable(f"Serper failed (HTTP {status} after {attempts} attempts: {message}); try again later")
    raise SearchError(
        f"Serper rejected the search (HTTP {status}: {message}); check the arguments: gl is a "
        f"two-letter country code, hl a language code, tbs one of {TBS_HELP}"
    )


def _check_searxng(response: httpx.Response, base: str, attempts: int) -> None:
    status = response.status_code
    if status == 200:
        return
    if status == 403:
        raise SearchUnavailable(
            f"SearXNG at {base} refused format=json (HTTP 403); enable `json` under search.formats in its settings.yml"
        )
    if status == 429:
        raise SearchUnavailable(
            f"SearXNG at {base} is rate-limiting us (HTTP 429 after {attempts} attempts); "
            "turn off server.limiter in its settings.yml or try again later"
        )
    raise SearchUnavailable(f"SearXNG at {base} answered HTTP {status}: {_message(response)}; check SEARXNG_URL")


def searxng_params(request: dict[str, Any]) -> dict[str, Any]:
    """Serper-style arguments as SearXNG's: `hl`+`gl` -> language, `page` -> pageno, `tbs` -> time_range."""
    hl, gl = request.get("hl") or "", request.get("gl") or ""
    params: dict[str, Any] = {"q": request["q"], "format": "json", "pageno": request.get("page", 1)}
    if hl:
        params["language"] = hl if "-" in hl or not gl else f"{hl}-{gl.upper()}"
    tbs = request.get("tbs")
    if tbs:
        if not tbs.startswith("qdr:"):
            raise SearchError(f"this search backend has no custom date ranges; use {TBS_HELP}")
        params["time_range"] = TIME_RANGES[tbs[4]]
    return params


def _date(value: Any) -> str | None:
    """SearXNG's ISO timestamp cut to the day; Serper's dates are free text, so others pass unchanged."""
    if not isinstance(value, str) or not value:
        return None
    return value[:10] if re.match(r"\d{4}-\d\d-\d\dT", value) else value


async def google_search(
    q: str,
    gl: str = "us",
    hl: str = "en",
    location: str | None = None,
    num: int | None = None,
    tbs: str | None = None,
    page: int | None = None,
    autocorrect: bool | None = None,
    *,
    config: SearchConfig | None = None,
) -> dict[str, Any]:
    """One search with a throwaway Searcher (servers keep one Searcher instead)."""
    async with Searcher(config) as searcher:
        return await searcher.google_search(q, gl, hl, location, num, tbs, page, autocorrect)
