"""A loopback vLLM engine for the loop's weight sync: `FakeOpenAI` (completions, `/v1/models`, runtime LoRA)
plus the development endpoints a full-weight sync goes through, answering as vLLM 0.32 answered them in
the exchange recorded in tests/golden/vllm_sync/:

    POST /pause?mode=wait                 {"status": "paused"}
    POST /collective_rpc                  {"results": [null]} (one worker), or HTTP 500 when the checkpoint
                                          folder cannot be read (a worker's error in `error.message`)
    POST /reset_prefix_cache?...          {"success": true}
    POST /update_weight_version           {"success": true, "new_version": V}
    POST /resume                          {"status": "resumed"}
    GET  /weight_info                     {"weight_version": V} ("default" until a version is set)

`broken` makes it fail as two kinds of engine fail: `"lora"`, one started without runtime LoRA updates
(`/v1/load_lora_adapter` is not a route there: FastAPI's HTTP 404); `"reload"`, one that cannot read the
checkpoint folder (another machine's disk), the recorded HTTP 500. `restart()` forgets what a restarted
vLLM forgets: its adapters and its weight version. `admin_calls` records every dev-endpoint POST's path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fake_openai import FakeOpenAI

GOLDEN = json.loads((Path(__file__).parent / "golden" / "vllm_sync" / "exchanges.json").read_text())


def recorded(name: str) -> Any:
    """The body vLLM answered the recorded call `name` with."""
    return json.loads(GOLDEN[name]["response_text"])


class FakeEngine(FakeOpenAI):
    """One vLLM engine; `with FakeEngine(replies, ...) as engine:` as `FakeOpenAI`, always vLLM-flavoured."""

    def __init__(self, replies: Any = (), **options: Any):
        super().__init__(list(replies) if isinstance(replies, tuple) else replies, vllm=True, **options)
        self.weight_version = "default"
        self.weights_path: str | None = None  # the folder of the last weights reloaded
        self.admin_calls: list[str] = []
        self.broken: str | None = None

    def restart(self) -> None:
        with self.lock:
            self.adapters.clear()
            self.weight_version, self.weights_path = "default", None

    def admin_answer(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """vLLM's answer to one dev-endpoint call, with the engine's state changed as vLLM changes it."""
        with self.lock:
            self.admin_calls.append(path.split("?")[0])
            if path.startswith("/pause"):
                return 200, recorded("pause")
            if path.startswith("/resume"):
                return 200, recorded("resume")
            if path.startswith("/reset_prefix_cache"):
                return 200, recorded("reset_prefix_cache")
            if path == "/update_weight_version":
                self.weight_version = body["new_version"]
                return 200, recorded("update_weight_version") | {"new_version": body["new_version"]}
            folder = body.get("kwargs", {}).get("weights_path", "")
            if self.broken == "reload" or not Path(folder).is_dir():
                return 500, recorded("collective_rpc_reload_missing")
            self.weights_path = folder
            return 200, recorded("collective_rpc_reload_weights")

    def _handler(self) -> Any:
        base, engine = super()._handler(), self

        class Handler(base):  # type: ignore[misc, valid-type]
            def do_GET(self) -> None:
                if self.path == "/weight_info":
                    self._send(200, {"weight_version": engine.weight_version})
                else:
                    super().do_GET()

            def do_POST(self) -> None:
                path = self.path
                if path.startswith(
                    ("/pause", "/resume", "/reset_prefix_cache", "/update_weight_version", "/collective_rpc")
                ):
                    length = int(self.headers.get("Content-Length") or 0)
                    body = json.loads(self.rfile.read(length) or b"null") or {}
                    self._send(*engine.admin_answer(path, body))
                elif path.endswith("/load_lora_adapter") and engine.broken == "lora":
                    self.rfile.read(int(self.headers.get("Content-Length") or 0))
                    with engine.lock:
                        engine.lora_requests.append({"refused": True})
                    self._send(404, {"detail": "Not Found"})
                else:
                    super().do_POST()

        return Handler
