"""The model server: what it is (`probe_server` asks before the first call, so that only vLLM gets
vLLM's own request fields) and how calling it fails for good (`ModelError` and its kinds)."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from nanbeige.tools.errors import ServiceUnavailable
from nanbeige.tools.wire import ACCEPT_ENCODING, answer_within, run_blocking

PROBE_TIMEOUT_S = 10.0
"""Most seconds a probe (`GET /models`, `GET /version`) may take in all, from the request to the answer's last byte."""
MAX_PROBE_BYTES = 8 * 2**20
"""The longest answer to a probe: a model list of thousands of entries is far shorter."""


class ModelError(Exception):
    """The model call failed for good (after retries, or on a non-retryable answer)."""


class EndpointUnavailable(ModelError, ServiceUnavailable):
    """The endpoint failed past its retries: it refused or reset the connection, did not finish a reply
    within the call's deadline, or kept answering 408/425/429/5xx. A pool of endpoints (`pool.py`) takes
    it out and asks another."""


class UnusableReply(EndpointUnavailable):
    """The endpoint answered, but not with a usable reply: a 200 whose body is no completion, a reply
    past the size caps (`stream.py`), or in token mode token ids that do not spell the reply's text.
    Another endpoint may answer well, so a pool takes this one out as it does one that is down."""


class ModelUnavailable(EndpointUnavailable):
    """No model server answers at the configured address."""


class ContextOverflow(ModelError):
    """The server refused the request because the prompt is longer than the model's context."""


@dataclass
class ServerInfo:
    """What an OpenAI-compatible server says about itself (see `probe_server`)."""

    vllm: bool
    """The server is vLLM (its model list names vLLM as owner, or its `/version` answers as vLLM's
    does), so it takes vLLM's own request fields and returns token ids."""
    max_model_len: int | None = None
    """The model's context length in tokens, where the server lists one (vLLM does)."""
    models: list[str] = field(default_factory=list)
    """The ids of the models the server lists."""
    weights: str | None = None
    """What the server says the served weights are, where it says: the model entry's `root` (vLLM
    lists the weights' path there, and a LoRA adapter's own path for an adapter), a version of the
    policy for rollouts."""


def probe_server(
    base_url: str, api_key: str | None, timeout: float = PROBE_TIMEOUT_S, model: str | None = None
) -> ServerInfo:
    """Ask the server at `base_url` (ending in `/v1`) what it is: `GET /models`, then `GET /version`
    at its root only when the model list names no owner. `max_model_len` is the one listed for
    `model`, or for the first model when `model` is not listed. A 401 means the server is up but
    wants a key: nothing more can be learnt. Raises ModelUnavailable with a short reason when
    nothing OpenAI-compatible answers."""
    try:
        return run_blocking(_probe(base_url, api_key, timeout, model))
    except httpx.HTTPError as exc:
        raise ModelUnavailable(type(exc).__name__) from None


async def _probe(base_url: str, api_key: str | None, timeout: float, model: str | None) -> ServerInfo:
    headers = {**ACCEPT_ENCODING, **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    async with httpx.AsyncClient(headers=headers, timeout=timeout) as http:
        info, settled = read_model_list(await _get_whole(http, base_url.rstrip("/") + "/models", timeout), model)
        if not settled:
            info.vllm = version_is_vllm(await _get_whole(http, server_root(base_url) + "/version", timeout))
    return info


async def _get_whole(http: httpx.AsyncClient, url: str, timeout: float) -> httpx.Response:
    """The answer to a GET of `url`, read whole within `timeout` seconds in all (its headers included) and
    `MAX_PROBE_BYTES`: a server that trickles its answer raises httpx's ReadTimeout at the deadline, not never."""
    return await answer_within(http, http.build_request("GET", url), timeout, MAX_PROBE_BYTES)


def read_model_list(response: httpx.Response, model: str | None) -> tuple[ServerInfo, bool]:
    """What a `/models` answer says, and whether that settles `vllm` (a list naming no owner does
    not). ModelUnavailable when the answer is not an OpenAI model list."""
    if response.status_code == 401:
        return ServerInfo(vllm=False), True
    try:
        entries = response.json().get("data") if response.status_code == 200 else None
    except (ValueError, AttributeError):  # not JSON, or JSON but not an object
        entries = None
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise ModelUnavailable(f"HTTP {response.status_code} from {response.url}: not an OpenAI-compatible server")
    owners = [entry["owned_by"] for entry in entries if entry.get("owned_by") is not None]
    chosen = next((entry for entry in entries if entry.get("id") == model), entries[0] if entries else {})
    length, root = chosen.get("max_model_len"), chosen.get("root")
    info = ServerInfo(
        vllm="vllm" in owners,
        max_model_len=length if isinstance(length, int) else None,
        models=[str(entry["id"]) for entry in entries if "id" in entry],
        weights=root if isinstance(root, str) and root else None,
    )
    return info, bool(owners)


def version_is_vllm(response: httpx.Response) -> bool:
    """vLLM answers `GET /version` with `{"version": "..."}`."""
    try:
        body = response.json()
    except ValueError:
        return False
    return response.status_code == 200 and isinstance(body, dict) and isinstance(body.get("version"), str)


def server_root(base_url: str) -> str:
    return base_url.rstrip("/").removesuffix("/v1")
