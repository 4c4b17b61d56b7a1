"""The HTTP side of the fake OpenAI server (tests/fake_openai.py): the request handler that reads each
request, asks the `FakeOpenAI` it serves for the answer, and writes it back as JSON, as server-sent
events or as an error; and the request fields a strict server, or one that is not vLLM, refuses. Kept apart
so the fake's answers read without the wire's details."""

from __future__ import annotations

import contextlib
import json
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fake_openai import FakeOpenAI, Reply

VLLM_ONLY = ("return_token_ids", "top_logprobs")  # refused by a server made with reject_extras=True
# The request fields of OpenAI's chat completions API: all that a strict server accepts.
OPENAI_CHAT_FIELDS = {
    "model",
    "messages",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "n",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "seed",
    "user",
    "response_format",
    "metadata",
    "store",
    "service_tier",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "web_search_options",
}


class FakeOpenAIHandler(BaseHTTPRequestHandler):
    """Answers for `fake`, which `FakeOpenAI` sets on a subclass made for each server it starts."""

    fake: FakeOpenAI
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers do
    disable_nagle_algorithm = True  # headers and body go in separate writes

    def log_message(self, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.fake.lock:
            self.fake.connections.add(self.connection)

    def finish(self) -> None:
        with self.fake.lock:
            self.fake.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_stream(self, chunks: list[dict[str, Any]], reply: Reply) -> None:
        """Server-sent events, each chunk a `data:` line, `data: [DONE]` last, in HTTP/1.1 chunks."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks] + ["data: [DONE]\n\n"]
        for sent, event in enumerate(events):
            time.sleep(reply.stall_s if sent == reply.stall_after else reply.piece_delay_s)
            data = event.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def _send_text(self, text: str) -> None:
        data = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _refused(self) -> bool:
        """Answers 401 as OpenAI does when the server wants a key this request lacks."""
        if self.fake.api_key is None or self.headers.get("Authorization") == f"Bearer {self.fake.api_key}":
            return False
        self._send(
            401,
            {
                "error": {
                    "message": "Incorrect API key provided",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            },
        )
        return True

    def do_GET(self) -> None:
        with self.fake.lock:
            self.fake.gets.append(self.path)
        if self._refused():
            return
        if self.path.endswith("/models"):
            self._send(200, self.fake.model_list())
        elif self.path == "/health":  # as vLLM answers while its engine lives: 200, no body
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/version" and self.fake.vllm:
            self._send(200, {"version": "0.33.0"})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        fake = self.fake
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self._refused():
            return
        if self.path.endswith(("/load_lora_adapter", "/unload_lora_adapter")):
            status, text = fake.lora_call(self.path, request)
            if status == 200:
                self._send_text(text)
            else:
                self._send(status, {"error": {"message": text, "type": "BadRequestError", "code": status}})
            return
        if self.path == "/tokenize" and fake.vllm:  # vLLM's: {count, max_model_len, tokens, token_strs}
            ids = fake.tokenize(request.get("prompt") or "")
            self._send(200, {"count": len(ids), "max_model_len": fake.max_model_len, "tokens": ids, "token_strs": None})
            return
        if not self.path.endswith(("/chat/completions", "/completions")):
            # as a server without that route; vllm-router asks `/v1/chat/completions/render` first
            self._send(404, {"detail": "Not Found"})
            return
        unexpected = fake.unexpected_fields(self.path, request)
        request["_headers"] = dict(self.headers)
        request["_received"] = time.monotonic()
        if not self._refused_fields(request, unexpected):
            self._answer(request)

    def _refused_fields(self, request: dict[str, Any], unexpected: set[str]) -> bool:
        """Answers 422 (a strict server) or 400 (a field this server refuses) when the request carries one."""
        fake = self.fake
        if unexpected:
            with fake.lock:
                fake.requests.append(request)
            names = ", ".join(repr(name) for name in sorted(unexpected))
            self._send(422, {"detail": f"Unexpected fields in the request: {{{names}}}"})
            return True
        refused = [name for name in fake.refuses if name in request]
        if refused:
            with fake.lock:
                fake.requests.append(request)
            self._send(
                400,
                {
                    "error": {
                        "message": fake.refuses[refused[0]],
                        "type": "invalid_request_error",
                        "param": None,
                        "code": None,
                    }
                },
            )
            return True
        if fake.reject_extras and any(k in request for k in VLLM_ONLY):
            self._send(
                400,
                {
                    "error": {
                        "message": "Unrecognized request argument supplied: return_token_ids",
                        "type": "invalid_request_error",
                    }
                },
            )
            return True
        return False

    def _answer(self, request: dict[str, Any]) -> None:
        """The script's next reply to a completion request: an error status, the whole body, or a stream."""
        fake = self.fake
        reply = fake.next_reply(request)
        with fake.slots:
            time.sleep(reply.delay_s)
        if reply.status != 200:
            self._send(reply.status, reply.body or {"error": {"message": f"status {reply.status}"}}, reply.headers)
        else:
            chat = self.path.endswith("/chat/completions")
            body = fake.completion(request, reply) if chat else fake.text_completion(request, reply)
            if request.get("stream") and fake.streams:
                self._send_stream(fake.stream_chunks(body, completions_api=not chat), reply)
            else:
                self._send(200, body)
