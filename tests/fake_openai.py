"""A loopback OpenAI-compatible server for tests and benchmarks.

It answers `POST /v1/chat/completions` and `GET /v1/models` with the documented response shapes.
The model's choices come from a script (a list of replies, or a function of the request), like
the scripted backend, but over real HTTP. With `vllm=True` it also returns vLLM's token fields
(`prompt_token_ids`, `choices[].token_ids`, logprobs): its "tokenizer" is UTF-8 bytes and its
"chat template" joins `<|role|>content` blocks, so prompts extend each other exactly as with a
real template. Usage figures count those bytes. It then also says it is vLLM as vLLM does: its
model list is `owned_by: "vllm"` with `max_model_len`, and `GET /version` answers. `GET /health` answers
200 with no body, as vLLM's does (a router in front of several servers waits for it).

It also takes vLLM's runtime LoRA calls, `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`
(`{"lora_name", "lora_path"}`): each body is recorded in `lora_requests`, and a loaded adapter is listed in
`/v1/models` as vLLM lists one (its path as `root`, the base model as `parent`). Loading a name already
loaded, or unloading one that is not, gets vLLM's HTTP 400 / 404.

With `strict=True` it answers like a FastAPI server whose request model forbids unknown fields:
a chat request with any field outside OpenAI's own gets HTTP 422 naming them.

Not every server streams as vLLM does: with `streams=False` it ignores `"stream": true` and answers
with the whole completion as JSON, as many OpenAI-compatible servers and proxies do; `refuses` maps
request fields to the words of an HTTP 400 answered to any request carrying them (a server that knows
no `stream_options`, or does not stream at all); a `Reply` with `stall_after` goes silent for
`stall_s` seconds after that many pieces of its stream.

With `max_in_flight=N` at most N replies take their `delay_s` at once and the others wait for a slot,
as a server whose GPU is busy makes them wait: a benchmark sees one endpoint's throughput end.

`outage(seconds)` takes it down as a crash would (connections refused, open ones cut, the request
in flight unanswered) and brings it back on the same port, as a restarted model server comes back.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from fake_openai_http import OPENAI_CHAT_FIELDS, FakeOpenAIHandler


def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    """The fake chat template: what the prompt token ids are made of. Without `tools` it is a template
    with no tools slot, as `transformers serve` with SmolLM2 showed (8 tools sent, `prompt_tokens: 55`);
    `FakeOpenAI(template_takes_tools=True)` passes the request's tools, shown as a template that takes them."""
    shown = f"<|tools|>{json.dumps(tools)}<|end|>" if tools else ""
    return shown + "".join(f"<|{m['role']}|>{m.get('content') or ''}<|end|>" for m in messages) + "<|assistant|>"


def tokens(text: str) -> list[int]:
    return list(text.encode("utf-8"))


@dataclass
class Reply:
    """One scripted answer: a message, or an HTTP error, after an optional delay."""

    content: str = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    delay_s: float = 0.0
    finish_reason: str = "stop"
    tool_calls: list[dict[str, Any]] | None = None
    message: dict[str, Any] | None = None
    """The whole assistant message, sent as it is (for shapes the fields above cannot express)."""
    piece_delay_s: float = 0.0
    """When the request streams: the wait before each piece of the reply, as a model generating it."""
    stall_after: int | None = None
    """When the request streams: the pieces sent before the server goes silent for `stall_s`."""
    stall_s: float = 0.0


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # many runs connect at once; the default backlog of 5 overflows and resets them
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a connection cut by an outage; the client sees it


Script = Callable[[dict[str, Any]], Reply | str]


class FakeOpenAI:
    """Run with `with FakeOpenAI(replies) as server:`; `server.base_url` ends in /v1."""

    def __init__(
        self,
        replies: list[Reply | str] | Script,
        vllm: bool = False,
        reject_extras: bool = False,
        default: Reply | str | None = None,
        tokenize: Callable[[str], list[int]] | None = None,
        stop_id: int | None = None,
        strict: bool = False,
        max_model_len: int = 32768,
        models: list[dict[str, Any]] | None = None,
        api_key: str | None = None,
        template_takes_tools: bool = False,
        streams: bool = True,
        refuses: dict[str, str] | None = None,
        max_in_flight: int | None = None,
    ):
        # at most this many replies' delays run at once, the rest wait, as on a server whose GPU is busy
        self.slots = threading.Semaphore(max_in_flight) if max_in_flight else contextlib.nullcontext()
        self.streams = streams  # False: `"stream": true` is ignored, the answer is the whole JSON body
        self.refuses = refuses or {}  # request field -> the message of the HTTP 400 a request carrying it gets
        self.template_takes_tools = template_takes_tools  # the chat template shows the request's tools
        self.replies = replies if callable(replies) else list(replies)
        self.default = default
        self.vllm = vllm
        self.reject_extras = reject_extras
        self.strict = strict  # 422 for fields OpenAI does not define; such requests are recorded too
        self.max_model_len = max_model_len  # listed per model when vllm
        self.models = models  # the /v1/models entries to list instead of the one fake model
        self.api_key = api_key  # when set, a request without it as bearer token gets 401
        self.gets: list[str] = []  # the path of every GET request
        self.tokenize = tokenize or tokens  # for /v1/completions: the model's tokenizer
        self.stop_id = stop_id  # appended to token_ids when a completion stops, as vLLM does with EOS
        self.requests: list[dict[str, Any]] = []
        self.lora_requests: list[dict[str, Any]] = []  # the body of every load/unload_lora_adapter call
        self.adapters: dict[str, str] = {}  # loaded LoRA adapters: name -> path
        self.lock = threading.RLock()  # a script function may call outage() while holding it
        self.connections: set[socket.socket] = set()  # open client connections, cut by an outage
        self.closed = False
        self.httpd = _Server(("127.0.0.1", 0), self._handler())
        self.base_url = f"http://127.0.0.1:{self.httpd.server_port}/v1"

    def __enter__(self) -> FakeOpenAI:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        with self.lock:
            self.closed = True  # an outage in progress does not come back
            httpd, self.httpd = self.httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()

    def outage(self, seconds: float) -> None:
        """Go down at once, as a crashed server does: the listening socket closes (connections are
        refused) and open connections are cut; after `seconds` listen again on the same port. Call
        it from a script function to cut the request being answered too."""
        with self.lock:
            httpd, self.httpd = self.httpd, None
            connections = list(self.connections)
        port = httpd.server_port
        httpd.socket.close()  # refused from now on; serve_forever stops below, off this thread
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        threading.Thread(target=httpd.shutdown, daemon=True).start()

        def come_back() -> None:
            with self.lock:
                if self.closed:
                    return
                self.httpd = _Server(("127.0.0.1", port), self._handler())
                threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

        back = threading.Timer(seconds, come_back)
        back.daemon = True  # a long outage must not keep the test process alive after the tests ended
        back.start()

    def next_reply(self, request: dict[str, Any]) -> Reply:
        with self.lock:
            self.requests.append(request)
            if callable(self.replies):
                reply = self.replies(request)
            elif self.replies:
                reply = self.replies.pop(0)
            else:
                # a client error, not retried: a script that ran out is the test's mistake
                reply = (
                    self.default
                    if self.default is not None
                    else Reply(status=400, body={"error": "the fake model's script has no more replies"})
                )
        return Reply(content=reply) if isinstance(reply, str) else reply

    def model_list(self) -> dict[str, Any]:
        """The `/v1/models` answer: vLLM lists its own name as owner and each model's context length;
        OpenAI-style servers name some other owner."""
        if self.models is not None:
            return {"object": "list", "data": self.models + self.adapter_entries()}
        entry: dict[str, Any] = {"id": "fake-model", "object": "model", "created": 0, "owned_by": "organization-owner"}
        if self.vllm:
            entry.update(owned_by="vllm", root="fake-model", max_model_len=self.max_model_len)
        return {"object": "list", "data": [entry] + self.adapter_entries()}

    def adapter_entries(self) -> list[dict[str, Any]]:
        """The loaded LoRA adapters as vLLM lists them: no context length, the base model as parent."""
        base = self.models[0]["id"] if self.models else "fake-model"
        with self.lock:
            adapters = list(self.adapters.items())
        return [
            {"id": name, "object": "model", "owned_by": "vllm", "root": path, "parent": base} for name, path in adapters
        ]

    def lora_call(self, path: str, request: dict[str, Any]) -> tuple[int, str]:
        """vLLM's answer to a runtime LoRA call: plain text on success, an error status otherwise."""
        name = request.get("lora_name")
        with self.lock:
            self.lora_requests.append(request)
            if path.endswith("/unload_lora_adapter"):
                if name not in self.adapters:
                    return 404, f"The lora adapter '{name}' cannot be found."
                del self.adapters[name]
                return 200, f"Success: LoRA adapter '{name}' removed successfully."
            if name in self.adapters:
                return 400, f"The lora adapter '{name}' has already been loaded."
            self.adapters[name] = request.get("lora_path")
            return 200, f"Success: LoRA adapter '{name}' added successfully."

    def unexpected_fields(self, path: str, request: dict[str, Any]) -> set[str]:
        """The fields a strict server refuses in this request (none unless strict)."""
        if not self.strict or not path.endswith("/chat/completions"):
            return set()
        return set(request) - OPENAI_CHAT_FIELDS

    def completion(self, request: dict[str, Any], reply: Reply) -> dict[str, Any]:
        prompt = tokens(render(request["messages"], request.get("tools") if self.template_takes_tools else None))
        completion = tokens(reply.content)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        if reply.message is not None:
            message = reply.message
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": reply.finish_reason}
        body: dict[str, Any] = {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(completion),
                "total_tokens": len(prompt) + len(completion),
            },
        }
        if self.vllm and request.get("return_token_ids"):
            body["prompt_token_ids"] = prompt
            choice["token_ids"] = completion
        if self.vllm and request.get("logprobs"):
            choice["logprobs"] = {
                "content": [
                    {"token": f"token_id:{t}", "logprob": -0.5, "bytes": [t], "top_logprobs": []} for t in completion
                ]
            }
        return body

    def stream_chunks(self, body: dict[str, Any], completions_api: bool) -> list[dict[str, Any]]:
        """A whole answer as the chunks of a stream (`"stream": true`), laid out as vLLM 0.32 sends them
        (tests/golden/vllm_stream/): for chat a first chunk with the role and, at its top level, the
        prompt's ids; the text a piece at a time (here one character each) with its token ids and
        logprobs in the choice; tool calls whole; the finish reason on a last empty piece (with the stop
        token, where there is one); the usage in a chunk of its own with no choices. A completions stream
        has no first empty chunk: its first piece carries the prompt's ids in the choice."""
        choice = body["choices"][0]
        head = {key: body[key] for key in ("id", "created", "model")}
        head["object"] = "text_completion" if completions_api else "chat.completion.chunk"
        text = choice["text"] if completions_api else choice["message"].get("content") or ""
        ids, logprobs = iter(choice.get("token_ids") or []), choice.get("logprobs") or {}
        entries = iter(logprobs.get("content") or logprobs.get("token_logprobs") or [])
        chunks = []
        if not completions_api:
            first: dict[str, Any] = {
                **head,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                ],
            }
            if "prompt_token_ids" in body:
                first["prompt_token_ids"] = body["prompt_token_ids"]
            chunks.append(first)
        all_ids = choice.get("token_ids") or []
        stop = 1 if completions_api and self.stop_id is not None and choice["finish_reason"] == "stop" else 0
        text_ids = len(all_ids) - stop  # the text's own ids, spread over its pieces (vLLM sends a piece per
        # token, or several tokens in one when it falls behind): a character a piece where the ids are the
        # fake's bytes, else four characters, about a token of English
        size = 1 if "token_ids" in choice else 4
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        for position, char in enumerate(pieces):
            piece: dict[str, Any] = {"index": 0, "finish_reason": None}
            piece |= {"text": char} if completions_api else {"delta": {"content": char}}
            if "token_ids" in choice:
                count = (position + 1) * text_ids // len(pieces) - position * text_ids // len(pieces)
                piece["token_ids"] = [next(ids) for _ in range(count)]
                taken = [next(entries) for _ in piece["token_ids"]] if logprobs else []
                if taken:
                    piece["logprobs"] = {"token_logprobs": taken} if completions_api else {"content": taken}
            if completions_api and not chunks:
                piece["prompt_token_ids"] = choice.get("prompt_token_ids")
            chunks.append({**head, "choices": [piece]})
        rest: dict[str, Any] = {"index": 0, "finish_reason": choice["finish_reason"]}
        left = list(ids)  # a stop token after the text
        if left:
            rest["token_ids"] = left
            rest["logprobs"] = {"token_logprobs": [next(entries) for _ in left]}
        if completions_api:
            rest["text"] = ""
        else:
            calls = [{"index": i, **call} for i, call in enumerate(choice["message"].get("tool_calls") or [])]
            rest["delta"] = {"tool_calls": calls} if calls else {}
        chunks.append({**head, "choices": [rest]})
        chunks.append({**head, "choices": [], "usage": body["usage"]})
        return chunks

    def text_completion(self, request: dict[str, Any], reply: Reply) -> dict[str, Any]:
        """A `/v1/completions` answer to a token-id prompt, with vLLM's token fields."""
        completion = self.tokenize(reply.content)
        prompt = request["prompt"]
        prompt_ids = self.tokenize(prompt) if isinstance(prompt, str) else prompt  # a text prompt is tokenized
        if reply.finish_reason == "stop" and self.stop_id is not None:
            completion = completion + [self.stop_id]
        # vLLM 0.32 (tests/golden/vllm_stream/completion.json): the prompt's ids are in the choice
        # and with logprobs=0, each token's text and a one-entry top_logprobs (checked in tests/test_real_vllm.py)
        texts = [f"token_id:{t}" for t in completion]
        choice = {
            "index": 0,
            "text": reply.content,
            "finish_reason": reply.finish_reason,
            "logprobs": {
                "token_logprobs": [-0.25] * len(completion),
                "tokens": texts,
                "top_logprobs": [{text: -0.25} for text in texts],
            },
            "prompt_token_ids": prompt_ids,
            "token_ids": completion,
        }
        return {
            "id": "cmpl-test",
            "object": "text_completion",
            "created": int(time.time()),
            "model": request.get("model"),
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion)},
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        """The request handler for this server: `FakeOpenAIHandler` answering for this fake."""
        return type("Handler", (FakeOpenAIHandler,), {"fake": self})


def mcp_call(server: str, tool: str, arguments: dict[str, Any], thought: str = "Let me check.") -> str:
    """An assistant reply in the mcp-xml dialect that calls one tool."""
    return (
        f"<think>\n{thought}\n</think>\n\n<use_mcp_tool>\n<server_name>{server}</server_name>\n"
        f"<tool_name>{tool}</tool_name>\n<arguments>\n{json.dumps(arguments)}\n</arguments>\n</use_mcp_tool>"
    )


def mcp_answer(answer: str) -> str:
    return f"<think>\nI have what I need.\n</think>\n\nThe answer is \\boxed{{{answer}}}."


def created_sandbox(messages: list[dict]) -> str:
    """The id of the sandbox the latest `create_sandbox` result in the messages named (as a model reads
    it from `Sandbox created with sandbox_id: ID`)."""
    for message in reversed(messages):
        for line in (message.get("content") or "").splitlines():
            if line.startswith("Sandbox created with sandbox_id: "):
                return line.split(": ", 1)[1].strip()
    raise AssertionError("no sandbox was created in this conversation")
