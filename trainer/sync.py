"""Making a new checkpoint the policy every serving vLLM samples from, without restarting them (`nanbeige loop`):
a LoRA adapter hot-loaded (`/v1/load_lora_adapter`), or a full checkpoint's weights loaded in place with
vLLM's own RL path (`reload_weights` through its dev endpoints); and asking each engine which policy it
serves, since an engine counts as synced only when it says so itself:
- an adapter is listed by `/v1/models` under its name, with its folder as `root`;
- full weights: after each reload the server's weight version is set to the checkpoint's path
  (`/update_weight_version`), and `/weight_info` reports it (`default` on a server never reloaded).

The shapes of vLLM's answers are in tests/golden/vllm_sync/ (recorded from vLLM)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from nanbeige.tools.errors import NanbeigeError
from nanbeige.tools.wire import ACCEPT_ENCODING, answer_within

WEIGHTS_FIX = (
    "vLLM takes new weights without a restart only with its dev endpoints on: start it with "
    "`nanbeige serve --weight-sync` (VLLM_SERVER_DEV_MODE=1)"
)
LORA_FIX = (
    "vLLM hot-loads adapters only when started with --enable-lora (and --max-lora-rank at least the "
    "adapter's rank) and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment"
)


class SyncError(NanbeigeError):
    """The server did not take the new policy; one line naming the fix."""


def engine_root(url: str) -> str:
    """An engine's address without `/v1`: its admin endpoints hang off the root, the OpenAI ones off `/v1`."""
    return url.rstrip("/").removesuffix("/v1")


MAX_ANSWER_BYTES = 16 * 2**20
"""The longest answer an engine's endpoint may give: a model list or a status is far shorter."""


def client(api_key: str | None, timeout: float) -> httpx.AsyncClient:
    """A client for the engines' endpoints; `timeout` bounds each request in all (`ask`), not only each read."""
    headers = {**ACCEPT_ENCODING, **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    return httpx.AsyncClient(headers=headers, timeout=timeout)


async def ask(http: httpx.AsyncClient, method: str, url: str, body: object = None) -> httpx.Response:
    """The engine's whole answer to one request, within the client's timeout in all (its headers included:
    an engine trickling them a byte at a time misses it) and `MAX_ANSWER_BYTES`; else httpx's error."""
    request = http.build_request(method, url, json=body)
    return await answer_within(http, request, http.timeout.read or 30.0, MAX_ANSWER_BYTES)


async def listed(http: httpx.AsyncClient, root: str) -> dict[str, str | None]:
    """The models an engine lists in `/v1/models`, each name with its `root` (an adapter's folder)."""
    response = await ask(http, "GET", f"{root}/v1/models")
    if response.status_code != 200:
        raise SyncError(
            f"the model server at {root} did not list its models: HTTP {response.status_code} {server_words(response)}"
        )
    try:
        entries = response.json().get("data")
        return {str(entry["id"]): entry.get("root") for entry in entries if isinstance(entry, dict)}
    except (ValueError, AttributeError, TypeError, KeyError):
        raise SyncError(f"the model server at {root} answered /v1/models with no model list") from None


async def weight_version(http: httpx.AsyncClient, root: str) -> str:
    """The weight version the engine reports (`GET /weight_info`, a dev endpoint)."""
    response = await ask(http, "GET", f"{root}/weight_info")
    if response.status_code == 404:
        raise SyncError(
            f"the model server at {root} has no /weight_info endpoint to say which weights it serves; "
            f"{WEIGHTS_FIX}, with vLLM 0.32 or newer"
        )
    try:
        version = response.json()["weight_version"] if response.status_code == 200 else None
    except (ValueError, TypeError, KeyError):
        version = None
    if not isinstance(version, str):
        raise SyncError(
            f"the model server at {root} did not say which weights it serves: HTTP "
            f"{response.status_code} {server_words(response)}"
        )
    return version


async def load_adapter(base_url: str, name: str, adapter: Path, api_key: str | None = None) -> None:
    """Hot-load a LoRA adapter into the vLLM server at `base_url` as model `name`, then check that it lists
    it. Nothing is sent when the server already lists `name` with this adapter (a resumed sync)."""
    path, root = str(adapter.resolve()), engine_root(base_url)
    try:
        async with client(api_key, 120.0) as http:
            if (await listed(http, root)).get(name, False) == path:
                return
            response = await ask(http, "POST", f"{root}/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
            if response.status_code != 200:
                raise SyncError(
                    f"the model server at {root} refused the LoRA adapter {path}: HTTP "
                    f"{response.status_code} {server_words(response)}; {LORA_FIX}"
                )
            if (await listed(http, root)).get(name, False) != path:
                raise SyncError(
                    f"the model server at {root} took the LoRA adapter {path} but does not list it as {name}"
                )
    except httpx.HTTPError as exc:
        raise SyncError(
            f"cannot reach the model server at {root} to load the LoRA adapter {path} "
            f"({type(exc).__name__}); start it, or use sync none"
        ) from None


async def load_weights(base_url: str, checkpoint: Path, api_key: str | None = None) -> None:
    """Load a full checkpoint's weights into the running vLLM at `base_url`, in place: pause generation
    (waiting for requests in flight), call every worker's `reload_weights` on the folder, drop the prefix
    cache (its KV entries were computed by the old weights), set the weight version to the checkpoint's
    path, resume; then check that the server reports that version. vLLM's own path for RL weight updates
    from disk; it needs the server's dev endpoints (`nanbeige serve --weight-sync`)."""
    root, version = engine_root(base_url), str(checkpoint.resolve())
    steps = [
        ("pause", "/pause?mode=wait", None),
        (
            "reload the weights",
            "/collective_rpc",
            {"method": "reload_weights", "timeout": 1800, "kwargs": {"weights_path": version}},
        ),
        ("reset the prefix cache", "/reset_prefix_cache?reset_running_requests=true", None),
        # before resuming: no request may be answered by the new weights under the old version
        ("set the weight version", "/update_weight_version", {"new_version": version}),
    ]
    try:
        async with client(api_key, 1900.0) as http:
            try:
                for what, path, body in steps:
                    response = await ask(http, "POST", root + path, body)
                    if response.status_code == 404:
                        raise SyncError(
                            f"the model server at {root} has no {path.split('?')[0]} endpoint; {WEIGHTS_FIX}"
                        )
                    if response.status_code != 200:
                        raise SyncError(
                            f"the model server at {root} could not {what} ({checkpoint}): HTTP "
                            f"{response.status_code} {server_words(response)}"
                        )
            finally:
                await ask(http, "POST", f"{root}/resume")
            reported = await weight_version(http, root)
    except httpx.HTTPError as exc:
        raise SyncError(
            f"cannot reach the model server at {root} to load the weights of {checkpoint} "
            f"({type(exc).__name__}); start it, or use sync none"
        ) from None
    if reported != version:
        raise SyncError(f"the model server at {root} reloaded {checkpoint} but reports weights {reported!r}")


async def serves(base_url: str, sync: str, checkpoint: str | None, api_key: str | None = None) -> str:
    """What the engine reports of the policy trained to `checkpoint`: the checkpoint's path when it serves
    it (its adapter listed under that name, or its weight version); else what it serves instead, in words
    (with weights, the version it reports). An engine that cannot be asked raises SyncError."""
    root = engine_root(base_url)
    try:
        async with client(api_key, 30.0) as http:
            if sync != "lora":
                return await weight_version(http, root)
            if checkpoint is None:
                return "its base model"  # adapters are only ever added: every engine still serves it
            adapter = str(Path(checkpoint) / "adapter")
            return (
                checkpoint
                if (await listed(http, root)).get(checkpoint, False) == adapter
                else f"no adapter {checkpoint}"
            )
    except httpx.HTTPError as exc:
        raise SyncError(
            f"cannot reach the model server at {root} to ask which policy it serves ({type(exc).__name__})"
        ) from None


async def sync_engine(base_url: str, sync: str, checkpoint: Path, api_key: str | None = None) -> None:
    """Make one engine serve the checkpoint, unless it says it does already (a rerun after a partial sync)."""
    if sync == "lora":
        await load_adapter(base_url, str(checkpoint), checkpoint / "adapter", api_key)
    elif await serves(base_url, sync, str(checkpoint), api_key) != str(checkpoint):
        await load_weights(base_url, checkpoint, api_key)


async def on_every_engine(urls: list[str], work: Callable[[str], Awaitable[object]]) -> dict[str, str]:
    """Run `work(url)` (a coroutine function) on every engine at once; the error of each that failed."""

    async def one(url: str) -> str | None:
        try:
            await work(url)
        except SyncError as exc:
            return str(exc)
        return None

    results = await asyncio.gather(*(one(url) for url in urls))
    return {url: error for url, error in zip(urls, results) if error is not None}


async def disagreeing(urls: list[str], sync: str, checkpoint: str | None, api_key: str | None = None) -> dict[str, str]:
    """The engines that do not serve the policy trained to `checkpoint` (None: the starting model, which with
    weights means the weight version the first engine asked reports), each with what it serves instead."""
    reports: dict[str, str] = {}

    async def ask(url: str) -> None:
        reports[url] = await serves(url, sync, checkpoint, api_key)

    failed = await on_every_engine(urls, ask)
    wanted = checkpoint or next((reports[url] for url in urls if url in reports), None)
    lacking = [url for url in urls if reports.get(url) != wanted]
    return {
        url: failed.get(url) or f"{url} serves " + (reports[url] if sync == "lora" else f"weights {reports[url]!r}")
        for url in lacking
    }


def server_words(response: httpx.Response) -> str:
    """The error message in vLLM's answer (`error.message`, or `message` in older versions), else its text."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    error = body.get("error", body) if isinstance(body, dict) else body
    return str(error.get("message", error) if isinstance(error, dict) else error)[:300]
