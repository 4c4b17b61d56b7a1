"""Making a new checkpoint the policy a running vLLM samples from, without restarting it (`train --loop`):
a LoRA adapter hot-loaded (`/v1/load_lora_adapter`), or a full checkpoint's weights loaded in place with
vLLM's own RL path (`reload_weights` through its dev endpoints)."""

from __future__ import annotations

from pathlib import Path

import httpx

WEIGHTS_FIX = ("vLLM takes new weights without a restart only with its dev endpoints on: start it with "
               "`nanbeige serve --weight-sync` (VLLM_SERVER_DEV_MODE=1)")
LORA_FIX = ("vLLM hot-loads adapters only when started with --enable-lora (and --max-lora-rank at least the "
            "adapter's rank) and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment")


class SyncError(Exception):
    """The server did not take the new policy; one line naming the fix."""


async def load_adapter(base_url: str, name: str, adapter: Path, api_key: str | None = None) -> None:
    """Hot-load a LoRA adapter into the vLLM server at `base_url` (ending in /v1) as model `name`.
    Nothing is sent when the server already lists `name` with this adapter (a resumed sync)."""
    path = str(adapter.resolve())
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        async with httpx.AsyncClient(headers=headers, timeout=120.0) as http:
            listed = await http.get(f"{root}/v1/models")
            if listed.status_code == 200 and any(entry.get("id") == name and entry.get("root") == path
                                                 for entry in listed.json().get("data", [])):
                return
            response = await http.post(f"{root}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
    except httpx.HTTPError as exc:
        raise SyncError(f"cannot reach the model server at {root} to load the LoRA adapter {path} "
                        f"({type(exc).__name__}); start it, or use sync none") from None
    if response.status_code != 200:
        raise SyncError(f"the model server at {root} refused the LoRA adapter {path}: HTTP {response.status_code} "
                        f"{server_words(response)}; {LORA_FIX}")


async def load_weights(base_url: str, checkpoint: Path, api_key: str | None = None) -> None:
    """Load a full checkpoint's weights into the running vLLM at `base_url` (ending in /v1), in place:
    pause generation (waiting for requests in flight), call every worker's `reload_weights` on the folder,
    drop the prefix cache (its KV entries were computed by the old weights), resume. vLLM's own path for
    RL weight updates from disk; it needs the server's dev endpoints (`nanbeige serve --weight-sync`)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    root = base_url.rstrip("/").removesuffix("/v1")
    steps = [("pause", "/pause?mode=wait", None),
             ("reload the weights", "/collective_rpc", {"method": "reload_weights", "timeout": 1800,
                                                        "kwargs": {"weights_path": str(checkpoint.resolve())}}),
             ("reset the prefix cache", "/reset_prefix_cache?reset_running_requests=true", None)]
    try:
        async with httpx.AsyncClient(headers=headers, timeout=1900.0) as http:
            try:
                for what, path, body in steps:
                    response = await http.post(root + path, json=body)
                    if response.status_code == 404:
                        raise SyncError(f"the model server at {root} has no {path.split('?')[0]} endpoint; "
                                        f"{WEIGHTS_FIX}")
                    if response.status_code != 200:
                        raise SyncError(f"the model server at {root} could not {what} ({checkpoint}): HTTP "
                                        f"{response.status_code} {server_words(response)}")
            finally:
                await http.post(f"{root}/resume")
    except httpx.HTTPError as exc:
        raise SyncError(f"cannot reach the model server at {root} to load the weights of {checkpoint} "
                        f"({type(exc).__name__}); start it, or use sync none") from None


def server_words(response: httpx.Response) -> str:
    """The error message in vLLM's answer (`error.message`, or `message` in older versions), else its text."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    error = body.get("error", body) if isinstance(body, dict) else body
    return str(error.get("message", error) if isinstance(error, dict) else error)[:300]
