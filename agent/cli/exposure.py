"""Whether `nanbeige serve` opens the model to the network, and what it then demands: a server off loopback
takes requests from anyone who can reach its address, and vLLM's development endpoints (weight sync) take no
key at all: they let a caller reload the weights or call methods inside the server."""

from __future__ import annotations

import ipaddress

from nanbeige.agent.cli.serve_config import real_api_key

EVERY_INTERFACE = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: it may resolve to any address
        return False


def exposure_problem(
    host: str, *, weight_sync: bool, api_key: str | None, no_api_key: bool, extra_args: list[str]
) -> str | None:
    """Why a server with these settings must not start, or None. `api_key` is the one given to nanbeige;
    what counts off loopback is the key vLLM will use (`real_api_key`), which an `--api-key` after `--`
    replaces, and an empty one undoes."""
    if api_key is not None and not api_key.strip():
        return "--api-key is empty: give the key clients must send, or leave --api-key out"
    if is_loopback(host):
        return None
    if weight_sync:
        return (
            f"--weight-sync opens vLLM's development endpoints, which take no API key, and is refused with "
            f"--host {host}: serve on 127.0.0.1 and reach it through an SSH tunnel or a proxy of your own"
        )
    if real_api_key(api_key, extra_args) is None and not no_api_key:
        return (
            f"--host {host} opens the server to the network with no API key (an empty one is none): pass "
            "--api-key KEY (clients send it as NANBEIGE_API_KEY), or --no-api-key to serve anyone who can reach it"
        )
    return None


def exposure(host: str, keyless: bool) -> str:
    """How far the server is open, for its ready line: nothing on loopback."""
    if is_loopback(host):
        return ""
    return (
        f"; listening on {'every interface' if host in EVERY_INTERFACE else host}, "
        f"{'no API key' if keyless else 'API key required'}"
    )
