"""A pool of model endpoints behind one model client: several OpenAI-compatible servers that serve the
same model (8 vLLMs on 8 GPUs, or several machines) used as one.

Routing: a run's first turn goes to the endpoint with the fewest requests in flight (ties: the one that
was given the fewest runs), and every later turn of the run to the same endpoint, whose prefix cache holds
the run's prompt so far. With `route="group"` the runs of one group (a question's G rollouts) share an
endpoint too, so the question's prompt is cached once.

Failure: an endpoint that refuses, resets, misses the call's deadline (`timeout_s`: a server that
trickles its reply a byte at a time, or sends only keep-alive pings, misses it too) or keeps answering
408/425/429/5xx past its own (short) retries, or that answers with something that is no usable reply (a
200 whose body is no completion, a reply past the size caps, in token mode ids that do not spell the
reply's text), is taken out for a cooldown; the failed call goes to another endpoint at once, from the
same prompt, so the run goes on from its last complete turn and no tool is called twice for one turn
(tools run only after a reply came back). After the cooldown one `GET /models` decides whether the
endpoint takes runs again; the cooldown doubles each time it fails again before a call on it succeeds
(a server that lists its models but never answers a call well is left alone longer and longer). Only
when every endpoint is out for longer than the call's retry budget does the call fail (`EndpointUnavailable`):
the run ends as `model_error`, which `resume` and `collect` run again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from nanbeige.agent.backends.completion import Completion
from nanbeige.agent.backends.llm import LLMConfig, OpenAIChat, served_by
from nanbeige.agent.backends.model_server import (
    PROBE_TIMEOUT_S,
    ContextOverflow,
    EndpointUnavailable,
    ModelUnavailable,
    ServerInfo,
    probe_server,
)
from nanbeige.tools.endpoint import without_credentials
from nanbeige.tools.errors import NanbeigeError

MEMBER_ATTEMPTS, MEMBER_RETRY_S = 2, 10.0
"""How often, and how long, one endpoint is asked before the pool tries another: briefly, since another is
at hand (a single endpoint waits out the whole `max_retry_s`, as it has nowhere else to go)."""
COOLDOWN_S = 30.0
"""How long a failed endpoint is left alone before it is probed again; doubled after each failed
probe, and after each failure before a call on it succeeded again, up to `MAX_COOLDOWN_S`."""
MAX_COOLDOWN_S = 300.0
ALL_OUT_WAIT_S = 2.0
"""While every endpoint is out, how often each is probed again (a pool whose servers all restart at once)."""
ROUTES = ("run", "group")


class PoolError(NanbeigeError):
    """Endpoints that cannot be used as one pool; the message names them."""


def check_urls(urls: list[str], route: str, backend: str) -> None:
    """Before anything is asked: the route is known, no endpoint is named twice, and several name servers."""
    if route not in ROUTES:
        raise PoolError(f"--route must be one of {', '.join(ROUTES)}, not {route!r}")
    twice = [url for i, url in enumerate(urls) if any(same_url(url, other) for other in urls[:i])]
    if twice:
        raise PoolError(
            f"--base-url {without_credentials(twice[0])} is given twice: each endpoint of a pool is named once"
        )
    if len(urls) > 1 and backend == "transformers":
        raise PoolError(
            "several --base-url name a pool of servers; --backend transformers runs the model in this process"
        )


def ask_endpoints(urls: list[str], api_key: str | None, model: str, token_mode: bool) -> list[ServerInfo]:
    """What every endpoint says about itself, asked at once. Refused, each named: endpoints that do not answer,
    that serve different models, and in token mode different weights (another tokenizer, or another policy
    version) or a server that is not vLLM."""

    def probe(url: str) -> ServerInfo | str:
        try:
            return probe_server(url, api_key, timeout=10.0, model=model)
        except ModelUnavailable as exc:
            return str(exc)

    with ThreadPoolExecutor(len(urls)) as threads:
        found = list(threads.map(probe, urls))
    shown = [without_credentials(url) for url in urls]
    down = [f"{url} ({info})" for url, info in zip(shown, found) if isinstance(info, str)]
    if down:
        raise PoolError(
            f"the model endpoint{'s' if len(down) > 1 else ''} {', '.join(down)} did not answer: every "
            "--base-url of a pool must serve the model when the command starts"
        )
    servers = [info for info in found if isinstance(info, ServerInfo)]
    checks: list[tuple[str, Callable[[ServerInfo], Any]]] = [("models", lambda info: sorted(info.models))]
    if token_mode:  # in chat mode the same model may sit in different folders on different machines
        checks.append(("weights", lambda info: info.weights))
    for what, key in checks:
        if any(key(info) != key(servers[0]) for info in servers):
            listing = "; ".join(f"{url}: {key(info)}" for url, info in zip(shown, servers))
            raise PoolError(
                f"the endpoints of the pool serve different {what} ({listing}); a pool's endpoints "
                "must serve the same one"
            )
    if token_mode and not all(info.vllm for info in servers):
        raise PoolError(
            "--token-mode needs vLLM at every --base-url; "
            + ", ".join(url for url, info in zip(shown, servers) if not info.vllm)
            + " is not vLLM"
        )
    return servers


def member_config(config: LLMConfig, url: str) -> LLMConfig:
    """The settings of the client for one endpoint of the pool."""
    return replace(
        config,
        base_url=url,
        more_base_urls=(),
        max_retry_s=min(config.max_retry_s, MEMBER_RETRY_S),
        max_attempts=min(config.max_attempts or MEMBER_ATTEMPTS, MEMBER_ATTEMPTS),
    )


def same_url(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


@dataclass
class Endpoint:
    """One server of the pool, with what the pool knows of it."""

    client: OpenAIChat
    url: str
    """Its address without credentials, as trajectories and messages show it."""
    in_flight: int = 0
    runs: int = 0
    requests: int = 0
    failures: int = 0
    tokens: int = 0
    down_until: float = 0.0
    cooldown_s: float = COOLDOWN_S
    problem: str | None = None
    """Why it was last taken out; None while it serves."""


@dataclass
class PoolConversation:
    """One run's state in the pool: the endpoint it is pinned to and its backend's own per-run state."""

    inner: Any
    group: str | None = None
    endpoint: Endpoint | None = None


@dataclass
class EndpointPool:
    """The model client of a pool (the `LLM` protocol of `llm.py`) over one client per endpoint."""

    members: list[OpenAIChat]
    config: LLMConfig
    """The run's settings: its sampling, and the retry budget a call has while every endpoint is out (each
    member keeps a short one of its own, `member_config`)."""
    route: str = "run"
    """`run`: a run keeps its endpoint; `group`: so does every run of its group."""
    clock: Callable[[], float] = time.monotonic
    endpoints: list[Endpoint] = field(init=False)
    groups: dict[str, Endpoint] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.endpoints = [Endpoint(member, str(served_by(member))) for member in self.members]
        first = self.members[0]
        self.server = first.server
        self.tokenizer_identity = first.tokenizer_identity
        self.template_identity = first.template_identity
        self.prompter = getattr(first, "prompter", None)  # token mode: the members share one tokenizer

    def new_conversation(self, group: str | None = None) -> PoolConversation:
        return PoolConversation(self.members[0].new_conversation(), group if self.route == "group" else None)

    def count_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, conversation: PoolConversation | None
    ) -> int | None:
        return self.members[0].count_prompt(messages, tools, conversation.inner if conversation else None)

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        conversation: PoolConversation | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> Completion:
        conversation = conversation or self.new_conversation()
        return await self._call(
            conversation,
            lambda client: client.complete(
                messages, tools, max_tokens, conversation=conversation.inner, on_text=on_text
            ),
        )

    async def complete_text(self, prompt: str, max_tokens: int, temperature: float) -> Completion:
        return await self._call(
            self.new_conversation(), lambda client: client.complete_text(prompt, max_tokens, temperature)
        )

    async def _call(self, conversation: PoolConversation, ask: Callable[[OpenAIChat], Any]) -> Completion:
        """The answer of the run's endpoint, or of the next one that answers when it fails; EndpointUnavailable
        when none has answered within the call's retry budget."""
        started = self.clock()
        while True:
            endpoint = await self._endpoint_for(conversation)
            if endpoint is None:
                left = self.config.max_retry_s - (self.clock() - started)
                if left <= 0:
                    raise EndpointUnavailable(self._all_down())
                await asyncio.sleep(min(ALL_OUT_WAIT_S, left))
                for each in self.endpoints:  # every one out: each is probed again, not left for its cooldown
                    each.down_until = min(each.down_until, self.clock())
                continue
            endpoint.in_flight += 1
            try:
                completion = await ask(endpoint.client)
            except ContextOverflow:
                raise  # the prompt's fault, not the endpoint's
            except EndpointUnavailable as exc:
                self._take_out(endpoint, str(exc))
                conversation.endpoint = None  # goes on elsewhere, from the same prompt
                continue
            finally:
                endpoint.in_flight -= 1
            endpoint.requests += 1
            endpoint.cooldown_s = COOLDOWN_S  # it answers well again: a later failure starts afresh
            endpoint.tokens += sum(completion.usage.get(k, 0) for k in ("prompt_tokens", "completion_tokens"))
            completion.endpoint = endpoint.url
            return completion

    async def _endpoint_for(self, conversation: PoolConversation) -> Endpoint | None:
        """The run's endpoint while it serves; else the group's; else the least busy that serves (after
        a probe, for one back from its cooldown). None while every endpoint is out."""
        for pinned in (conversation.endpoint, self.groups.get(conversation.group or "")):
            if pinned is not None and pinned.problem is None:
                return self._pin(conversation, pinned, new=pinned is not conversation.endpoint)
        while True:
            now = self.clock()
            open_ = [e for e in self.endpoints if e.problem is None or e.down_until <= now]
            if not open_:
                return None
            chosen = min(open_, key=lambda e: (e.in_flight, e.runs, self.endpoints.index(e)))
            if chosen.problem is None or await self._probe(chosen):
                return self._pin(conversation, chosen, new=True)

    def _pin(self, conversation: PoolConversation, endpoint: Endpoint, new: bool) -> Endpoint:
        if new:
            endpoint.runs += 1
            conversation.endpoint = endpoint
            if conversation.group is not None:
                self.groups[conversation.group] = endpoint
        return endpoint

    async def _probe(self, endpoint: Endpoint) -> bool:
        """Whether an endpoint back from its cooldown answers its model list; if not, a longer cooldown."""
        endpoint.down_until = self.clock() + PROBE_TIMEOUT_S  # one probe at a time
        response = await endpoint.client.get_briefly("/models")  # within a deadline: a probe may trickle too
        if response is not None and response.status_code == 200:
            endpoint.problem = None  # its cooldown stays as long until a call on it succeeds
            return True
        endpoint.down_until = self.clock() + endpoint.cooldown_s
        endpoint.cooldown_s = min(endpoint.cooldown_s * 2, MAX_COOLDOWN_S)
        return False

    def _take_out(self, endpoint: Endpoint, problem: str) -> None:
        endpoint.failures += 1
        if endpoint.problem is None:  # a second run failing on it does not extend its cooldown
            endpoint.problem, endpoint.down_until = problem, self.clock() + endpoint.cooldown_s
            endpoint.cooldown_s = min(endpoint.cooldown_s * 2, MAX_COOLDOWN_S)

    def _all_down(self) -> str:
        reasons = "; ".join(f"{e.url}: {e.problem}" for e in self.endpoints)
        return f"all {len(self.endpoints)} model endpoints failed ({reasons})"

    def summary(self) -> str:
        """One line: requests, failures and tokens per endpoint."""
        return "endpoints: " + "; ".join(
            f"{e.url} {e.requests} requests, {e.failures} failures, {e.tokens:,} tokens" for e in self.endpoints
        )

    async def aclose(self) -> None:
        await asyncio.gather(*(member.aclose() for member in self.members))
