"""The egress guard: the one way the program fetches a URL on someone else's behalf (a URL a model named,
or one a handed-over file holds).

Only http(s); no connection to loopback, private, link-local or otherwise non-public addresses (unless the
operator allows them). The check happens where the connection is made, after DNS resolution and for every
redirect hop, and the connection goes to the address that was checked, so a name that re-resolves
elsewhere cannot slip through. Bodies are read up to a cap, after decompression, and only in one coding
(`wire.py`); a redirect's body is not read at all. A fetch has a deadline in all, headers included, and
every way it fails is a FetchError.

Clients of endpoints the user configured (the model server, a judge, a search API) are not fetches on
anyone's behalf and do not come here; `tests/test_egress_structure.py` lists them, and fails when any
other code opens an outbound HTTP connection.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import anyio
import httpcore
import httpx

from nanbeige.tools.wire import ACCEPT_ENCODING, read_capped

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
    """Host names fetched even when they resolve to private addresses (NANBEIGE_ALLOWED_HOSTS=a,b: an
    intranet server)."""
    resolve: Resolver = field(default=resolve_host, repr=False)
    """Name resolution (replaceable in tests)."""
    max_bytes: int = 20_000_000
    """Largest response body read."""
    connect_timeout_s: float = 20.0
    """Most seconds to connect to one address."""
    read_timeout_s: float = 60.0
    """Most seconds between two reads (and to send the request)."""
    deadline_s: float = 120.0
    """Most seconds one fetch may take in all, redirects included, from the request to the body's last byte:
    a server sending its answer a byte at a time trips no read timeout, but misses this."""

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


def policy_from_env(env: Mapping[str, str] | None = None) -> FetchPolicy:
    """The operator's policy: NANBEIGE_ALLOW_PRIVATE_URLS=1 and NANBEIGE_ALLOWED_HOSTS."""
    env = os.environ if env is None else env
    allowed = frozenset(h.strip().lower() for h in env.get("NANBEIGE_ALLOWED_HOSTS", "").split(",") if h.strip())
    return FetchPolicy(allow_private=env.get("NANBEIGE_ALLOW_PRIVATE_URLS") == "1", allowed_hosts=allowed)


def check_url(url: str) -> str:
    """The URL's host, after checking the scheme (only http and https may be fetched)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed IPv6 bracket, a bad port
        raise FetchError(f"refused: {url!r} is not a URL: {exc}") from None
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


def client(policy: FetchPolicy, headers: Mapping[str, str] | None = None) -> httpx.AsyncClient:
    """An HTTP client whose every connection, redirects included, passes `policy`; proxies from the
    environment are not used (a proxy would connect where the guard cannot see). It follows no redirect
    itself: httpx would read a redirect's whole body, uncapped (`get` follows them)."""
    return httpx.AsyncClient(
        transport=GuardedTransport(policy),
        timeout=httpx.Timeout(policy.read_timeout_s, connect=policy.connect_timeout_s),
        follow_redirects=False,
        headers={**ACCEPT_ENCODING, **(headers or {})},
        trust_env=False,
    )


@dataclass
class Reply:
    """What a guarded GET brought back."""

    url: str
    """Final URL, after redirects."""
    status: int
    reason: str
    headers: httpx.Headers
    body: bytes
    """At most the policy's `max_bytes`, decompressed."""
    truncated: bool
    """Whether the body was longer than that."""


async def get(url: str, policy: FetchPolicy, headers: Mapping[str, str] | None = None, max_redirects: int = 5) -> Reply:
    """GET a URL through the guard, whatever its status, within the policy's deadline; FetchError
    (BlockedAddress for an address off limits) when it cannot be fetched, whatever the reason."""
    check_url(url)
    try:
        with anyio.fail_after(policy.deadline_s):
            async with client(policy, headers) as http:
                return await _follow(http, http.build_request("GET", url), policy.max_bytes, max_redirects)
    except FetchError:
        raise
    except TimeoutError:
        raise FetchError(f"could not fetch {url}: no whole answer within {policy.deadline_s:g} s") from None
    except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
        raise FetchError(f"could not fetch {url}: {type(exc).__name__}: {exc}") from None


async def _follow(http: httpx.AsyncClient, request: httpx.Request, max_bytes: int, max_redirects: int) -> Reply:
    """The answer to `request`, redirects followed (each hop passes the guard); a redirect's body is left unread."""
    for _ in range(max_redirects + 1):
        response = await http.send(request, stream=True)
        try:
            if response.next_request is None:
                body, truncated = await read_capped(response, max_bytes)
                reason = response.reason_phrase
                return Reply(str(response.url), response.status_code, reason, response.headers, body, truncated)
            request = response.next_request
        finally:
            await response.aclose()
    raise FetchError(f"more than {max_redirects} redirects")


def get_blocking(
    url: str, policy: FetchPolicy, headers: Mapping[str, str] | None = None, max_redirects: int = 5
) -> Reply:
    """`get` from a thread without an event loop."""
    return anyio.run(get, url, policy, headers, max_redirects)
