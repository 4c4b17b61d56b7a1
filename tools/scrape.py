"""Scrape a page (Jina Reader or a direct, guarded fetch) and extract what was asked with a model.

The extraction model is any OpenAI-compatible endpoint (by default the agent's own model). When a
page is longer than that model's context, the page is cut shorter and the call retried.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from nanbeige.tools import paid_units
from nanbeige.tools.egress import FetchError, FetchPolicy, check_url, policy_from_env, ssl_context
from nanbeige.tools.endpoint import LOCAL_BASE_URL, LOCAL_MODEL, ChatEndpoint
from nanbeige.tools.fetch import Page, fetch_direct, to_text
from nanbeige.tools.wire import answer_within

BLOCKED_LINKS = ("huggingface.co/datasets", "huggingface.co/spaces")
RETRY_STATUSES = {408, 409, 425, 429, 500, 502, 503, 504}
MAX_SUMMARY_BYTES = 16 * 2**20
"""The longest answer of the extraction model: 8192 tokens of text with their JSON are far shorter."""


EXTRACTION_ENDPOINT = ChatEndpoint(
    base_url=LOCAL_BASE_URL,
    model=LOCAL_MODEL,
    temperature=1.0,
    max_tokens=8192,
    timeout_s=300.0,
    retries=2,
    retry_wait_s=1.0,
)
"""The extraction model's defaults, before NANBEIGE_SUMMARY_* (else the agent's NANBEIGE_*) variables: the agent's
own model at the local server, asked as the reference's scrape server asked (temperature 1.0, 8192 tokens), three
attempts a call. The model card of Nanbeige4.1-3B names Qwen3-14B as the summary model of its deep-search setup
(the reference harness's SUMMARY_LLM_MODEL_NAME); here, by default, it is whatever model those variables name."""


class ScrapeError(Exception):
    """Scraping or extraction failed; the message says why and, for setup problems, the fix."""


@dataclass
class ScrapeConfig:
    """Where pages come from and which model extracts from them."""

    backend: str = "direct"
    """`jina` (Jina Reader, needs a key) or `direct` (fetch here and convert)."""
    jina_api_key: str | None = None
    """Jina Reader key (JINA_API_KEY)."""
    jina_base_url: str = "https://r.jina.ai"
    """Jina Reader endpoint (JINA_BASE_URL)."""
    summary: ChatEndpoint = EXTRACTION_ENDPOINT
    """The extraction model's endpoint: its base URL (NANBEIGE_SUMMARY_BASE_URL, else NANBEIGE_BASE_URL), model
    (NANBEIGE_SUMMARY_MODEL, else NANBEIGE_MODEL) and key (NANBEIGE_SUMMARY_API_KEY, else NANBEIGE_API_KEY)."""
    extraction_prompt: str | None = None
    """The extraction prompt as a `str.format` template whose two fields are the information to
    extract and the page content, in that order (NANBEIGE_EXTRACTION_PROMPT; `--reference` sets it
    to the reference harness's own). None: ours."""
    max_page_chars: int = 409_600
    """Longer pages are cut to this many characters before extraction."""
    trim_step_chars: int = 40_960
    """When the page does not fit the extraction model, cut this many more characters each retry."""
    retry_wait_s: float = 1.0
    """First wait between retries of Jina Reader (doubles each time; the extraction model's is `summary`'s)."""
    policy: FetchPolicy = field(default_factory=FetchPolicy)
    """Which addresses direct fetches may reach."""


def scrape_config_from_env(env: Mapping[str, str] = os.environ) -> ScrapeConfig:
    """The scrape settings from environment variables (see ScrapeConfig for the names)."""
    jina_key = env.get("JINA_API_KEY") or None
    backend = env.get("NANBEIGE_SCRAPE_BACKEND") or ("jina" if jina_key else "direct")
    if backend not in ("jina", "direct"):
        raise ScrapeError(f"NANBEIGE_SCRAPE_BACKEND must be jina or direct, not {backend!r}")
    if backend == "jina" and not jina_key:
        raise ScrapeError("NANBEIGE_SCRAPE_BACKEND=jina needs JINA_API_KEY")
    defaults = ScrapeConfig()
    summary = replace(
        defaults.summary,
        base_url=env.get("NANBEIGE_SUMMARY_BASE_URL") or env.get("NANBEIGE_BASE_URL") or defaults.summary.base_url,
        model=env.get("NANBEIGE_SUMMARY_MODEL") or env.get("NANBEIGE_MODEL") or defaults.summary.model,
        api_key=env.get("NANBEIGE_SUMMARY_API_KEY") or env.get("NANBEIGE_API_KEY") or None,
    )
    return ScrapeConfig(
        backend=backend,
        jina_api_key=jina_key,
        jina_base_url=env.get("JINA_BASE_URL") or defaults.jina_base_url,
        summary=summary,
        extraction_prompt=env.get("NANBEIGE_EXTRACTION_PROMPT") or None,
        policy=policy_from_env(env),
    )


def _retrying(wait_s: float, attempts: int) -> AsyncRetrying:
    def retryable(exc: BaseException) -> bool:
        if isinstance(exc, httpx.HTTPStatusError):
            return exc.response.status_code in RETRY_STATUSES
        return isinstance(exc, (httpx.TransportError))

    return AsyncRetrying(
        retry=retry_if_exception(retryable),
        stop=stop_after_attempt(attempts),
        reraise=True,
        wait=wait_exponential(multiplier=wait_s, max=8),
    )


def strip_reader_prefix(url: str) -> str:
    """The model sometimes prefixes the reader's own address; the page is what follows it."""
    return re.sub(r"^(https?://r\.jina\.ai/)+", "", url.strip(), flags=re.IGNORECASE)


def blocked_link(url: str) -> bool:
    parts = urlsplit(url.lower())
    host = (parts.hostname or "").removeprefix("www.")
    return any(f"{host}{parts.path}".startswith(blocked) for blocked in BLOCKED_LINKS)


async def fetch_jina(url: str, config: ScrapeConfig, headers: dict[str, str] | None = None) -> Page:
    """Fetch a page through Jina Reader (markdown). Setup problems raise ScrapeError; the rest FetchError."""
    # The model's headers go to the page, not to the reader: they must never replace our key.
    request_headers = {
        **(headers or {}),
        "Authorization": f"Bearer {config.jina_api_key}",
        "X-Return-Format": "markdown",
    }
    timeout = httpx.Timeout(60.0, connect=20.0)
    try:
        async with httpx.AsyncClient(timeout=timeout, verify=ssl_context()) as client:
            async for attempt in _retrying(config.retry_wait_s, 5):
                with attempt:
                    reader = client.build_request(
                        "GET", f"{config.jina_base_url.rstrip('/')}/{url}", headers=request_headers
                    )
                    # the reader's answer within the limits of our own fetch: the deadline, the size, one coding
                    response = await answer_within(client, reader, config.policy.deadline_s, config.policy.max_bytes)
                    response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        status = exc.response.status_code
        if status == 401:
            raise ScrapeError("Jina Reader rejected the API key (HTTP 401): check JINA_API_KEY") from None
        if status == 402:
            raise ScrapeError(
                "Jina Reader balance is exhausted (HTTP 402): top up the account, or set NANBEIGE_SCRAPE_BACKEND=direct"
            ) from None
        raise FetchError(f"Jina Reader could not fetch {url}: HTTP {status}") from None
    except httpx.HTTPError as exc:
        raise FetchError(f"Jina Reader could not be reached: {type(exc).__name__}: {exc}") from None
    text = to_text(response.content, response.headers.get("content-type", "text/plain"))
    paid_units.add("jina_tokens", len(text) // 4)
    return Page(url=url, text=text, content_type="text/markdown")


async def fetch_page(url: str, config: ScrapeConfig, headers: dict[str, str] | None = None) -> Page:
    """The page as text, by the configured backend; Jina failures fall back to a direct fetch."""
    url = strip_reader_prefix(url)
    host = check_url(url)
    await config.policy.addresses(host)  # refuse private targets whichever backend fetches them
    if config.backend != "jina":
        return await fetch_direct(url, config.policy, headers)
    try:
        return await fetch_jina(url, config, headers)
    except FetchError as jina_error:  # the reader could not get it: try ourselves, as a browser would
        try:
            return await fetch_direct(url, config.policy, headers)
        except FetchError as direct_error:
            raise FetchError(f"{direct_error} (and through Jina Reader: {jina_error})") from None


def extraction_prompt(content: str, info_to_extract: str, template: str | None = None) -> str:
    if template is not None:  # the reference's: fields filled by position, as its server fills them
        return template.format(info_to_extract, content)
    return (
        "Your task is to read the web page below and pull out the information that is asked for.\n\n"
        f"## Information to extract\n{info_to_extract}\n\n"
        "## How to do it\n"
        "1. Extract everything on the page that bears on the request, with exact figures, names and dates.\n"
        "2. If the page does not have exactly what is asked, give the closest related details it does have, "
        "and say that the exact information is missing.\n"
        "3. Quote short key passages word for word where precision matters.\n"
        "4. Keep links that lead to the requested information.\n"
        "5. Do not add anything that is not on the page.\n\n"
        f"## Page content\n{content}\n\n"
        "## Extracted information\n"
    )


def _is_context_error(response: httpx.Response) -> bool:
    text = response.text.lower()
    return response.status_code == 400 and "context" in text and ("length" in text or "too long" in text)


def summary_request(prompt: str, endpoint: ChatEndpoint) -> dict[str, Any]:
    """The extraction request as the reference's scrape server sent it, so that pages are read as
    during training: for a model whose name contains `gpt` (case as written; OpenAI's API wants
    `max_completion_tokens`), no sampling settings; for any other, the endpoint's temperature (1.0 by
    default) and nothing else (no top_p or top_k)."""
    messages = [{"role": "user", "content": prompt}]
    if "gpt" in (endpoint.model or ""):
        return {"model": endpoint.model, "max_completion_tokens": endpoint.max_tokens, "messages": messages}
    return {
        "model": endpoint.model,
        "max_tokens": endpoint.max_tokens,
        "messages": messages,
        "temperature": endpoint.temperature,
    }


async def _summary_call(client: httpx.AsyncClient, prompt: str, config: ScrapeConfig) -> httpx.Response:
    body = summary_request(prompt, config.summary)
    async for attempt in _retrying(config.summary.retry_wait_s, config.summary.retries + 1):
        with attempt:
            request = client.build_request("POST", "/chat/completions", json=body)
            response = await answer_within(client, request, config.summary.timeout_s, MAX_SUMMARY_BYTES)
            if response.status_code in RETRY_STATUSES:
                response.raise_for_status()
    return response


async def extract_info(content: str, info_to_extract: str, config: ScrapeConfig) -> tuple[str, int, int]:
    """(extracted text, tokens used, characters of the page the model read). The page is cut from the
    end, `trim_step_chars` more each time, until it fits the extraction model's context."""
    endpoint = config.summary
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    timeout = httpx.Timeout(endpoint.timeout_s, connect=10.0)
    used = min(len(content), config.max_page_chars)
    async with httpx.AsyncClient(
        base_url=endpoint.base_url.rstrip("/"), headers=headers, timeout=timeout, verify=ssl_context()
    ) as client:
        for attempt in range(1, 6):
            try:
                response = await _summary_call(
                    client, extraction_prompt(content[:used], info_to_extract, config.extraction_prompt), config
                )
            except httpx.HTTPStatusError as exc:
                raise ScrapeError(f"the extraction model failed: HTTP {exc.response.status_code}") from None
            except httpx.HTTPError as exc:
                raise ScrapeError(
                    f"the extraction model at {endpoint.base_url} cannot be reached "
                    f"({type(exc).__name__}); set NANBEIGE_SUMMARY_BASE_URL to a running "
                    "OpenAI-compatible server"
                ) from None
            if _is_context_error(response) and used > 0:
                used = max(0, used - config.trim_step_chars * attempt)
                continue
            if response.status_code != 200:
                raise ScrapeError(f"the extraction model failed: HTTP {response.status_code}: {response.text[:300]}")
            body = response.json()
            text = body["choices"][0]["message"].get("content") or ""
            text = text.rsplit("</think>", 1)[-1].strip()  # keep the answer, not the reasoning
            tokens = int((body.get("usage") or {}).get("total_tokens", 0))
            paid_units.add("summary_tokens", tokens)
            return text, tokens, used
    raise ScrapeError("the page does not fit the extraction model's context even when cut short")


def scrape_stats(content: str, used: int) -> dict[str, Any]:
    return {
        "line_count": content.count("\n") + 1,
        "char_count": len(content),
        "last_char_line": content[:used].count("\n") + 1,
        "all_content_displayed": used >= len(content),
    }


async def scrape_and_extract_info(
    url: str, info_to_extract: str, custom_headers: dict[str, str] | None, config: ScrapeConfig
) -> dict[str, Any]:
    """Scrape `url` and extract `info_to_extract` from it: the result object the model expects.
    Raises FetchError (the page) or ScrapeError (setup or extraction) with a readable message."""
    if blocked_link(strip_reader_prefix(url)):
        raise FetchError(
            "Hugging Face dataset and space pages cannot be scraped here; look for the information on another page"
        )
    page = await fetch_page(url, config, custom_headers)
    if not page.text.strip():
        raise FetchError(f"the page at {url} has no readable text")
    extracted, tokens, used = await extract_info(page.text, info_to_extract, config)
    return {
        "success": True,
        "url": page.url,
        "extracted_info": extracted,
        "error": "",
        "scrape_stats": scrape_stats(page.text, used),
        "model_used": config.summary.model,
        "tokens_used": tokens,
    }
