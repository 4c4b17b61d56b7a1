"""Fetching a web page safely and turning it into text.

The model chooses the URLs, so fetching is guarded: only http(s), and no connection to loopback,
private, link-local or otherwise non-public addresses (unless allowed). The check happens where
the connection is made, after DNS resolution and for every redirect hop, and the connection goes
to the address that was checked, so a name that re-resolves elsewhere cannot slip through.
HTML becomes markdown (trafilatura); PDF becomes text (pypdf).
"""

from __future__ import annotations

import codecs
import functools
import io
import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import anyio
import httpcore
import httpx

BROWSER_UA = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"
Resolver = Callable[[str], Awaitable[list[str]]]


class FetchError(Exception):
    """The page could not be fetched; the message says why, for the model to read."""


class BlockedAddress(FetchError):
    """The URL points at an address the fetcher may not reach."""


async def resolve_host(host: str) -> list[str]:
    """All addresses a host name resolves to."""
    infos = await anyio.to_thread.run_sync(lambda: socket.getaddrinfo(host, None, type=socket.SOCK_STREAM))
    return list(dict.fromkeys(info[4][0] for info in infos))


# IPv6 ranges that carry an IPv4 address (NAT64, 6to4, IPv4-compatible, SIIT): through a
# translator they can reach any IPv4 host, private ones included, so they are never "public".
EMBEDDED_IPV4 = [
    ipaddress.ip_network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "::/96", "::ffff:0:0:0/96")
]


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped:
            ip = ip.ipv4_mapped
        elif any(ip in network for network in EMBEDDED_IPV4):
            return False
    return ip.is_global and not ip.is_multicast


@dataclass
class FetchPolicy:
    """Where the fetcher may connect, and how much it reads."""

    allow_private: bool = False
    """Allow loopback, private and link-local addresses (NANBEIGE_ALLOW_PRIVATE_URLS=1)."""
    allowed_hosts: frozenset[str] = frozenset()
    """Host names fetched even when they resolve to private addresses (an intranet server)."""
    resolve: Resolver = field(default=resolve_host, repr=False)
    """Name resolution (replaceable in tests)."""
    max_bytes: int = 20_000_000
    """Largest response body read."""
    connect_timeout_s: float = 20.0
    read_timeout_s: float = 60.0

    async def addresses(self, host: str) -> list[str]:
        """The addresses to connect to for `host`; raises BlockedAddress if any is off limits."""
        host = host.strip("[]")
        try:
            addresses = [str(ipaddress.ip_address(host))]
        except ValueError:
            try:
                addresses = await self.resolve(host)
            except OSError as exc:
                raise FetchError(f"cannot resolve host {host!r}: {exc}") from None
        if self.allow_private or host.lower() in self.allowed_hosts:
            return addresses
        for address in addresses:
            if not is_public(address):
                where = host if address == host else f"{host} resolves to {address}, which"
                raise BlockedAddress(f"refused: {where} is not a public address")
        return addresses


def check_url(url: str) -> str:
    """The URL's host, after checking the scheme (only http and https may be fetched)."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise FetchError(f"refused: only http(s) URLs can be fetched, not {url!r}")
    return parts.hostname


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """Resolves and checks every host before connecting, then connects to the checked address."""

    def __init__(self, policy: FetchPolicy):
        self.policy = policy
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable | None = None,
    ) -> httpcore.AsyncNetworkStream:
        failure: Exception | None = None
        for address in await self.policy.addresses(host):  # all checked; try each, as a browser does
            try:
                return await self.inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:
                failure = exc
        raise failure or httpcore.ConnectError(f"no address for {host}")

    async def connect_unix_socket(self, *args: object, **kwargs: object) -> httpcore.AsyncNetworkStream:
        raise BlockedAddress("refused: unix sockets cannot be fetched")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """One TLS context for every client: building one loads the CA bundle (tens of milliseconds)."""
    return httpx.create_ssl_context()


class GuardedTransport(httpx.AsyncHTTPTransport):
    """An httpx transport whose every connection (redirects included) passes the policy."""

    def __init__(self, policy: FetchPolicy):
        super().__init__(verify=ssl_context())
        # The stock transport offers no resolver hook, so its pool is rebuilt around ours.
        self._pool = httpcore.AsyncConnectionPool(ssl_context=ssl_context(), network_backend=_GuardedBackend(policy))


@dataclass
class Page:
    """A fetched page as text."""

    url: str
    """Final URL, after redirects."""
    text: str
    """Markdown for HTML, plain text for PDF and text types."""
    content_type: str


async def fetch_direct(url: str, policy: FetchPolicy, headers: dict[str, str] | None = None) -> Page:
    """GET a URL through the guard and convert it to text. Raises FetchError with a readable reason."""
    check_url(url)
    timeout = httpx.Timeout(policy.read_timeout_s, connect=policy.connect_timeout_s)
    request_headers = {"User-Agent": BROWSER_UA, **(headers or {})}
    try:
        async with httpx.AsyncClient(
            transport=GuardedTransport(policy),
            timeout=timeout,
            follow_redirects=True,
            max_redirects=5,
            headers=request_headers,
        ) as client:
            async with client.stream("GET", url) as response:
                if response.status_code >= 400:
                    raise FetchError(f"HTTP {response.status_code} {response.reason_phrase} for {url}")
                body = await _read_capped(response, policy.max_bytes)
                final_url, content_type = str(response.url), response.headers.get("content-type", "")
    except BlockedAddress:
        raise
    except httpx.TooManyRedirects:
        raise FetchError(f"too many redirects from {url}") from None
    except httpx.HTTPError as exc:
        raise FetchError(f"could not fetch {url}: {type(exc).__name__}: {exc}") from None
    return Page(url=final_url, text=to_text(body, content_type, final_url), content_type=content_type)


async def _read_capped(response: httpx.Response, max_bytes: int) -> bytes:
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            break
    return b"".join(chunks)[:max_bytes]


def to_text(body: bytes, content_type: str, url: str = "") -> str:
    """Page bytes as text: PDF through pypdf, HTML through trafilatura, anything else decoded."""
    if body.startswith(b"%PDF") or "application/pdf" in content_type:
        return pdf_to_text(body)
    text = body.decode(_charset(content_type), errors="replace")
    if "html" in content_type or text.lstrip()[:200].lower().startswith(("<!doctype html", "<html")):
        return html_to_markdown(text, url)
    return text


def _charset(content_type: str) -> str:
    for part in content_type.split(";")[1:]:
        name, _, value = part.strip().partition("=")
        if name.lower() == "charset":
            try:
                return codecs.lookup(value.strip('"')).name
            except LookupError:
                break
    return "utf-8"


def html_to_markdown(html: str, url: str = "") -> str:
    import trafilatura  # imported on first use: it loads lxml and friends

    markdown = trafilatura.extract(
        html,
        url=url or None,
        output_format="markdown",
        include_links=True,
        include_tables=True,
        include_formatting=True,
        include_images=False,
        favor_recall=True,
    )
    if markdown:
        return markdown
    # No main content found (a bare page or an app shell): fall back to all visible text.
    return trafilatura.html2txt(html) or ""


def pdf_to_text(body: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(body))
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PdfReadError, ValueError, KeyError) as exc:
        raise FetchError(f"the PDF could not be read: {exc}") from None
    return "\n\n".join(f"--- page {i} ---\n{text.strip()}" for i, text in enumerate(pages, start=1))
