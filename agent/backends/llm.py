"""Model backends: one small protocol and an OpenAI-compatible HTTP client (scripted.py: a test model).

The HTTP client speaks `/v1/chat/completions` to vLLM or any OpenAI-compatible server. Before its
first call it asks the server what it is (`GET /v1/models`, see `model_server.py`); only to vLLM does it
send vLLM's own request fields, asking for the prompt and completion token ids and the sampling
logprobs so turns are token-exact. Other servers may refuse unknown fields (FastAPI servers answer
422), so they never get them; a server that claims vLLM and still refuses them is asked again
without them. A streamed request is read by what the server sends back (events, or the whole body);
a server that refuses `stream_options` or `stream` is asked again without them (`refusals.py`).

Every attempt has a deadline (`timeout_s`) from sending the request to the reply's last byte, and every
body a size cap (`stream.py`): a server that trickles a byte at a time, or sends only keep-alive comments,
fails the attempt at the deadline however often it writes. A reply past the caps, or a 200 whose body is no
completion, is an `UnusableReply`: a failed endpoint, which a pool leaves for another (`pool.py`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, NoReturn, Protocol

import httpx
import orjson
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, stop_before_delay

from nanbeige.agent.backends.completion import Completion, parse_completion
from nanbeige.agent.backends.model_server import (
    PROBE_TIMEOUT_S,
    ContextOverflow,
    EndpointUnavailable,
    ModelError,
    ModelUnavailable,
    ServerInfo,
    UnusableReply,
    probe_server,  # noqa: F401  (imported from here with the client it informs)
    read_model_list,
    server_root,
    version_is_vllm,
)
from nanbeige.agent.backends.refusals import (
    RETRY_STATUSES,
    VLLM_EXTRAS,
    RequestShape,
    RetryableStatus,
    backoff,
    error_text,
)
from nanbeige.agent.backends.stream import Reader, read_whole, streamed
from nanbeige.tools.endpoint import LOCAL_BASE_URL, LOCAL_MODEL
from nanbeige.tools.wire import ACCEPT_ENCODING

# Sampling per tool dialect, for settings the user leaves unset: the model card's deep-search
# temperature with the reference harness's top-p and repetition penalty for mcp-xml, the card's
# general chat and tool-use settings for tool-call. A backend given an unset config samples as mcp-xml.
DIALECT_SAMPLING = {
    "mcp-xml": {"temperature": 1.0, "top_p": 0.95, "repetition_penalty": 1.05},
    "tool-call": {"temperature": 0.6, "top_p": 0.95, "repetition_penalty": 1.0},
}


@dataclass
class LLMConfig:
    """How to reach the model and how to sample from it."""

    base_url: str = LOCAL_BASE_URL
    """OpenAI-compatible endpoint, up to and including `/v1`."""
    more_base_urls: tuple[str, ...] = ()
    """Further endpoints serving the same model beside `base_url`: with any, the runs are spread over
    all of them as one pool (`pool.py`)."""
    model: str = LOCAL_MODEL
    """Model name sent with every request."""
    api_key: str | None = None
    """Bearer token, if the server wants one. Never logged."""
    temperature: float | None = None
    """Sampling temperature; None: the dialect's (1.0 for mcp-xml, the card's deep-search setting;
    0.6 for tool-call, its general chat and tool-use setting)."""
    top_p: float | None = None
    """Nucleus sampling threshold; None: the dialect's (0.95 for both)."""
    repetition_penalty: float | None = None
    """Penalty on tokens already in the prompt or reply (1.0 = off); None: the dialect's (1.05 for
    mcp-xml, as the reference harness sends it; 1.0 for tool-call). Sent to vLLM only: other servers
    do not know the field."""
    max_tokens: int = 16384
    """Most tokens one reply may have."""
    stop: list[str] = field(default_factory=list)
    """Extra stop strings."""
    timeout_s: float = 600.0
    """Most seconds one model call may take, from sending the request to the reply's last byte, streamed
    or not: a server still writing then (a byte at a time, or keep-alive pings) has failed the attempt,
    which is asked again like a cut connection. Silence this long fails it too."""
    max_attempts: int | None = None
    """Most attempts per call on connection errors and 408/425/429/5xx answers; None: as many as
    `max_retry_s` allows."""
    max_retry_s: float = 300.0
    """The retry budget of one call, in seconds: no attempt starts later than this after the first,
    so a model server that restarts or sheds load (429) within it costs the run only time."""
    retry_wait_s: float = 0.5
    """First wait between attempts; it doubles each time up to `max_retry_wait_s`, plus jitter,
    unless the server said how long to wait (Retry-After)."""
    max_retry_wait_s: float = 20.0
    """Longest wait of the doubling backoff."""
    max_retry_after_s: float = 60.0
    """Longest wait a server's Retry-After (seconds, or an HTTP date) is followed for."""

    def urls(self) -> list[str]:
        """Every endpoint the model is served at, `base_url` first."""
        return [self.base_url, *self.more_base_urls]

    def for_dialect(self, dialect: str) -> LLMConfig:
        """This config with each sampling setting left unset taken from the dialect's defaults."""
        unset = {name: value for name, value in DIALECT_SAMPLING[dialect].items() if getattr(self, name) is None}
        return replace(self, **unset) if unset else self

    def sampling(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "repetition_penalty": self.repetition_penalty,
            "max_tokens": self.max_tokens,
            "stop": self.stop,
        }


class LLM(Protocol):
    """What the loop needs from a model backend. One backend serves many runs at once; whatever it
    must remember about one conversation lives in the object `new_conversation` returns, which the
    run keeps and passes back with every call."""

    config: LLMConfig
    tokenizer_identity: dict[str, str] | None
    """The tokenizer's name and SHA-256, when the backend tokenizes (recorded in trajectories)."""
    template_identity: dict[str, str] | None
    """The chat template's name and SHA-256, when the backend renders prompts itself."""

    def new_conversation(self, group: str | None = None) -> Any:
        """Per-run state (the last prompt and what was sampled, for the next prompt to extend), or
        None for a backend that keeps none. `group`: the group the run belongs to (a question's
        rollouts), which a pool of endpoints may keep on one endpoint."""

    def count_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, conversation: Any
    ) -> int | None:
        """Exact prompt size with the model's own tokenizer and chat template, when the backend has
        them; None when only the server knows (its usage figures are used instead)."""

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        conversation: Any = None,
        on_text: Callable[[str], None] | None = None,
    ) -> Completion:
        """The model's reply. With `on_text`, the reply is streamed and each piece of its text handed to
        it as it comes (the reasoning of a server that splits it off between `<think>` and `</think>`);
        the Completion is the same as without."""

    async def aclose(self) -> None: ...


def served_by(llm: Any) -> str | None:
    """The address of the server a backend talks to, without credentials (a user and password in the URL,
    its query), for the trajectory: `resume` finds the server again; None for a model in this process."""
    llm = getattr(llm, "members", [llm])[0]  # a pool: its first endpoint, which resume asks to be named again
    if not isinstance(llm, OpenAIChat):
        return None
    url = httpx.URL(llm.config.base_url)
    return str(url.copy_with(username=None, password=None, query=None, fragment=None))


class TooSlow(Exception):
    """An attempt's reply was not whole by the call's deadline."""


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, (RetryableStatus, httpx.TransportError, TooSlow))


class OpenAIChat:
    """Async client for an OpenAI-compatible `/chat/completions` endpoint. Pass what `probe_server`
    learnt as `server`; without it the client asks the server itself before its first call."""

    def __init__(
        self, config: LLMConfig, transport: httpx.AsyncBaseTransport | None = None, server: ServerInfo | None = None
    ):
        self.config = config.for_dialect("mcp-xml")  # a no-op for a config set up for its dialect
        headers = {"Content-Type": "application/json", **ACCEPT_ENCODING}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        timeout = httpx.Timeout(config.timeout_s, connect=10.0)
        self.http = httpx.AsyncClient(
            base_url=config.base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )
        self.server = server
        # vLLM's fields go only to vLLM; each optional part is turned off for good once refused
        self.shape = RequestShape(extras=server.vllm if server else False)
        self._asking = asyncio.Lock()  # concurrent first calls wait for one answer
        self.tokenizer_identity: dict[str, str] | None = None  # the server tokenizes
        self.template_identity: dict[str, str] | None = None

    def new_conversation(self, group: str | None = None) -> Any:
        return None  # the server renders every prompt from the messages

    def count_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, conversation: Any
    ) -> int | None:
        return None  # the server tokenizes; its usage figures say how much

    def request_body(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        max_tokens: int | None,
        stream: bool = False,
    ) -> dict[str, Any]:
        c = self.config
        body: dict[str, Any] = {
            "model": c.model,
            "messages": messages,
            "temperature": c.temperature,
            "top_p": c.top_p,
            "max_tokens": max_tokens or c.max_tokens,
        }
        if c.stop:
            body["stop"] = c.stop
        if tools:
            body["tools"] = tools
        if stream:
            body.update(self.shape.streaming())
        if self.shape.extras:
            body.update(VLLM_EXTRAS)
            if c.repetition_penalty != 1.0:
                body["repetition_penalty"] = c.repetition_penalty
        return body

    async def _post(self, content: bytes, path: str, stream: bool = False) -> httpx.Response:
        """The server's answer; with `stream`, a 200 answer's body is left to be read as it comes. Any
        other body is read whole here, within the size cap."""
        try:
            response = await self._send(self.http.build_request("POST", path, content=content))
        except httpx.ConnectError as exc:
            raise ModelUnavailable(f"cannot connect to {self.config.base_url}: {exc}") from exc
        if not stream or response.status_code != 200:
            response = await read_whole(response)
        if response.status_code in RETRY_STATUSES:
            raise RetryableStatus(response)
        return response

    async def _post_with_retries(
        self, body: dict[str, Any], path: str = "/chat/completions", read: Reader | None = None
    ) -> tuple[Any, float]:
        """The response and the seconds spent waiting for it (encoding the request is not counted).
        With `read`, the request streams, and a 200 answer is what `read` makes of its stream: a
        connection cut in the middle of it is asked again like one cut before it. Each attempt has
        `timeout_s` in all: one past it is asked again too."""
        c = self.config
        stop = stop_before_delay(c.max_retry_s)
        if c.max_attempts is not None:
            stop = stop | stop_after_attempt(c.max_attempts)
        retrying = AsyncRetrying(
            retry=retry_if_exception(lambda e: _retryable(e) or isinstance(e, ModelUnavailable)),
            stop=stop,
            wait=backoff(c.retry_wait_s, c.max_retry_wait_s, c.max_retry_after_s),
            reraise=True,
        )
        content = orjson.dumps(body)
        started = time.perf_counter()
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._attempt(content, path, read), time.perf_counter() - started
        except RetryableStatus as exc:
            raise EndpointUnavailable(
                f"model server answered HTTP {exc.response.status_code}: {error_text(exc.response)}"
            ) from None
        except httpx.TimeoutException as exc:
            raise EndpointUnavailable(f"model call timed out after {c.timeout_s:g} s ({type(exc).__name__})") from None
        except TooSlow:
            raise EndpointUnavailable(
                f"model call timed out after {c.timeout_s:g} s (no whole reply by then)"
            ) from None
        except httpx.TransportError as exc:
            raise EndpointUnavailable(f"model call failed: {type(exc).__name__}: {exc}") from None
        raise AssertionError("unreachable")

    async def _attempt(self, content: bytes, path: str, read: Reader | None) -> Any:
        """One attempt: the response, or what `read` makes of a 200 answer's stream; TooSlow past the deadline."""
        try:
            async with asyncio.timeout(self.config.timeout_s):
                response = await self._post(content, path, stream=read is not None)
                if read is not None and response.status_code == 200:
                    return await read(response)
                return response
        except TimeoutError:
            raise TooSlow() from None

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        conversation: Any = None,
        on_text: Callable[[str], None] | None = None,
    ) -> Completion:
        if self.server is None:
            await self._learn_server()
        read = streamed(on_text, timeout_s=self.config.timeout_s) if on_text is not None else None
        answer, latency_s = await self._ask_shaped(
            lambda: self.request_body(messages, tools, max_tokens, stream=read is not None),
            "/chat/completions",
            read,
            ("extras", "stream_options", "stream") if read else ("extras",),
        )
        try:
            return parse_completion(answer if read else orjson.loads(answer.content), latency_s)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise UnusableReply(f"model server sent a reply that is not a chat completion: {exc!r}") from None

    async def _ask_shaped(
        self, build: Callable[[], dict[str, Any]], path: str, read: Reader | None, parts: tuple[str, ...]
    ) -> tuple[Any, float]:
        """The answer to the request `build` makes (what `read` makes of it, or the response), and the
        seconds it took. A refusal naming one of the optional `parts` the request carries is asked again
        with a request built anew without it (each part is refused at most once, so this ends); any
        other refusal raises ModelError."""
        while True:
            answer, latency_s = await self._post_with_retries(build(), path, read=read)
            if not isinstance(answer, httpx.Response) or answer.status_code == 200:
                return answer, latency_s
            if not self.shape.drop_refused(answer, parts):
                self.raise_for_answer(answer)

    async def complete_text(self, prompt: str, max_tokens: int, temperature: float) -> Completion:
        """A plain text completion (`/completions`) with only the fields BFCL's generator sends: the
        prompt as text, `max_tokens` and `temperature` (the server's defaults for everything else)."""
        body = {"model": self.config.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature}
        answer, latency_s = await self._post_with_retries(body, "/completions")
        if answer.status_code != 200:
            self.raise_for_answer(answer)
        try:
            return parse_completion(orjson.loads(answer.content), latency_s, completions_api=True)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise UnusableReply(f"model server sent a reply that is not a completion: {exc!r}") from None

    async def _learn_server(self) -> None:
        async with self._asking:
            if self.server is None:  # another call may have asked while this one waited
                self.server = await self._ask_server()
                self.shape.extras = self.server.vllm if self.server else False

    async def _ask_server(self) -> ServerInfo | None:
        """What `probe_server` learns, over this client's connection; None when the server cannot
        say right now (this call goes without vLLM's fields and the next one asks again)."""
        try:
            response = await self.get_briefly("/models")
            if response is None or response.status_code in RETRY_STATUSES:
                return None
            info, settled = read_model_list(response, self.config.model)
            if not settled:
                version = await self.get_briefly(server_root(self.config.base_url) + "/version")
                if version is None:
                    return None
                info.vllm = version_is_vllm(version)
        except ModelUnavailable:
            return ServerInfo(vllm=False)  # something answers without a model list, which vLLM always has
        return info

    async def _send(self, request: httpx.Request) -> httpx.Response:
        try:  # the response, its body left to read; a pooled connection anyio finds closed is a transport error
            return await self.http.send(request, stream=True)
        except AttributeError as exc:  # anyio's, when the closed transport's socket is None; any other is a bug
            if "NoneType" not in str(exc):
                raise
            raise httpx.ReadError(f"the connection closed under the request ({exc})", request=request) from exc

    async def get_briefly(self, path: str) -> httpx.Response | None:
        """The answer to a GET of `path` (a probe), read whole within `PROBE_TIMEOUT_S` in all and the size
        cap; None when the server does not give one (unreachable, too slow, too long)."""
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                return await read_whole(await self._send(self.http.build_request("GET", path)))
        except (httpx.HTTPError, TimeoutError, UnusableReply):
            return None

    def raise_for_answer(self, response: httpx.Response) -> NoReturn:
        text = error_text(response)
        if response.status_code == 400 and "context" in text.lower() and "length" in text.lower():
            raise ContextOverflow(text)
        hint = ""
        if "--enable-auto-tool-choice" in text:  # vLLM started without a tool-call parser
            hint = (
                " (the server parses no tool calls: start it with `nanbeige serve --dialect tool-call`, or vLLM "
                "with --enable-auto-tool-choice --tool-call-parser NAME; or use --dialect mcp-xml)"
            )
        raise ModelError(f"model server answered HTTP {response.status_code}: {text}{hint}")

    async def aclose(self) -> None:
        await self.http.aclose()
