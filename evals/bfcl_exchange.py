"""The host's side of a BFCL item's exchange with its sandbox (`bfcl_jail.py`): what it answers, and what
result line it records.

In the sandbox, the package's code and the model's code run in one Python process: the package `eval()`s
the model's calls there. So anything the package's code could hold to prove a question its own (a key, a
nonce) the model's code could read too, and the host cannot tell who wrote a question by who sent it. It
tells by what it says, against what the host itself served:

- a completion only right after the count of the same prompt, at the run's temperature, with at most the
  package's own token budget, and no more of them than the package's step limit allows the item;
- a web search or a page only for a call (`search_engine_query`, `fetch_url_content`) in the model's last
  reply, decoded here by the package's handler, each call once; the page fetched through the egress guard;
- a result line only when its replies are the replies the host served, in order.

Any other question is the sandbox breaking the exchange: the item ends with an error line, scoring nothing.
What the model's code can still do is shape the tool results and prompts its model reads, in its own item and
in the items run after it in the same sandbox: it runs where the tools run. Not from the package's answers:
the items' sandboxes show them as an empty folder (`bfcl_jail.answer_folders`).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import types
from typing import Any

from nanbeige.evals import bfcl
from nanbeige.tools import egress
from nanbeige.tools.sandbox import SandboxError

MAX_NEW_TOKENS = 4096
"""The most tokens the package's handler asks a completion for."""


class Refused(SandboxError):
    """A question, or a result line, the package's own code could not have sent."""


def host_answers(completions: Any, handler: Any, entry: dict[str, Any]) -> ItemHost:
    """What answers the questions of `entry`'s sandbox: completions by `completions` (our backend, as the
    handler would call it here), with `handler` (the package's, built here) counting prompts and decoding
    replies."""
    return ItemHost(completions, handler, entry)


class ItemHost:
    """One item's exchange, on the host. Call it with a question for its answer; `result` checks the line the
    sandbox sends when the item is done."""

    def __init__(self, completions: Any, handler: Any, entry: dict[str, Any]) -> None:
        from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT

        self.completions, self.handler, self.entry = completions, handler, entry
        self.turns = max(1, len(entry.get("question") or []))
        self.steps = MAXIMUM_STEP_LIMIT + 1
        """A turn's steps: the package stops a turn after its step limit."""
        self.counted: str | None = None
        """The prompt the sandbox just had counted: the package counts each prompt right before asking it."""
        self.calls: list[tuple[str, dict[str, Any]]] = []
        """The searches and pages the model's last reply asked for, not yet asked by the sandbox."""
        self.served: list[str] = []
        """The text of every completion served to this item."""

    def __call__(self, question: dict[str, Any]) -> dict[str, Any]:
        if isinstance(text := question.get("tokenize"), str):
            self.counted = text
            return {"count": len(self.handler.tokenizer.tokenize(text))}
        if isinstance(call := question.get("complete"), dict):
            return self.complete(call)
        if isinstance(params := question.get("search"), dict) and isinstance(params.get("q"), str):
            call = self.take("search_engine_query", {"keywords": params["q"]}, "a search")
            try:
                return {"result": importlib.import_module("serpapi").GoogleSearch(params).get_dict()}
            except RuntimeError as exc:  # our search backend is unavailable (`bfcl_run.web_search`)
                self.calls.append(call)  # the package may ask again (it retries a search that was refused)
                return {"error": str(exc)}
        if isinstance(page := question.get("fetch"), dict) and set(page) == {"url", "mode"}:
            self.take("fetch_url_content", {"url": page["url"], "mode": page["mode"]}, "a page")
            try:
                return {"result": fetch_page(page["url"], page["mode"])}
            except Exception as exc:  # noqa: BLE001 - raised in the sandbox as the package raised it here
                return {"raise": str(exc)}
        raise Refused(
            f"it asked something other than a completion, a count, a search or a page: {json.dumps(question)[:200]}"
        )

    def complete(self, call: dict[str, Any]) -> dict[str, Any]:
        prompt, max_tokens, temperature = call.get("prompt"), call.get("max_tokens"), call.get("temperature")
        if not isinstance(prompt, str) or prompt != self.counted:
            raise Refused("it asked for a completion of a prompt it had not counted first, as the package does")
        if temperature != self.handler.temperature or not isinstance(max_tokens, int) or max_tokens > MAX_NEW_TOKENS:
            raise Refused(f"it asked for a completion with settings the package does not use: {json.dumps(call)[:200]}")
        if len(self.served) >= self.turns * self.steps:
            raise Refused(f"it asked for more completions than the package's {self.steps} steps a turn allow")
        self.counted = None
        try:
            reply = self.completions.create(prompt=prompt, max_tokens=max_tokens, temperature=temperature)
        except Exception as exc:  # noqa: BLE001 - raised again in the sandbox, where the handler records it
            return {"error": str(exc)}
        text = reply.choices[0].text
        self.served.append(text)
        self.calls = requested(self.handler, self.cleaned(text))
        return {
            "text": text,
            "prompt_tokens": reply.usage.prompt_tokens,
            "completion_tokens": reply.usage.completion_tokens,
        }

    def take(self, name: str, asked: dict[str, Any], what: str) -> tuple[str, dict[str, Any]]:
        """The last reply's call that asked for this search or page, marked as asked; Refused if none did."""
        for index, (called, arguments) in enumerate(self.calls):
            if called == name and all(arguments.get(k, "raw" if k == "mode" else None) == v for k, v in asked.items()):
                return self.calls.pop(index)
        raise Refused(f"it asked for {what} the model's last reply did not ask for: {json.dumps(asked)[:200]}")

    def cleaned(self, text: str) -> Any:
        """A served reply as the package's handler records it in the result line."""
        usage = types.SimpleNamespace(prompt_tokens=0, completion_tokens=0)
        reply = types.SimpleNamespace(choices=[types.SimpleNamespace(text=text)], usage=usage)
        return self.handler._parse_query_response_prompting(reply)["model_responses"]

    def result(self, line: dict[str, Any]) -> dict[str, Any]:
        """The result line the sandbox sent, if its replies are the ones served, in order, over at most the
        item's turns (an error line, which scores nothing, as it is); Refused otherwise."""
        result = line.get("result")
        if isinstance(result, str) and result.startswith("Error during inference"):
            return line
        turns_ok = (
            isinstance(result, list)
            and 0 < len(result) <= self.turns
            and all(isinstance(turn, list) and 0 < len(turn) <= self.steps for turn in result)
        )
        if not turns_ok or [step for turn in result for step in turn] != [self.cleaned(t) for t in self.served]:
            raise Refused("it sent a result line whose replies are not the ones the model gave")
        return line


def requested(handler: Any, reply: Any) -> list[tuple[str, dict[str, Any]]]:
    """The calls in a reply, as the package's handler decodes them, each as (name, arguments); read as
    literals, never run. A reply the handler cannot decode asks for nothing."""
    try:
        decoded = handler.decode_execute(reply, has_tool_call_tag=False)
    except Exception:  # noqa: BLE001 - the handler's own failure: the package executes nothing then either
        return []
    calls = []
    for text in decoded if isinstance(decoded, list) else []:
        try:
            node = ast.parse(str(text), mode="eval").body
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args:
                calls.append((node.func.id, {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}))
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
            continue
    return calls


# ---------------------------------------------------------------- pages, through the egress guard


def fetch_page(url: Any, mode: Any, policy: egress.FetchPolicy | None = None) -> dict[str, Any]:
    """A page for the web search categories' `fetch_url_content`, by the package's own method (its headers,
    its error texts, its Markdown and text conversions), so that the text is the official pipeline's, but
    its connection made by the egress guard (`policy`, else the operator's): no loopback, private or
    link-local address, every redirect checked, the body capped. The URL is the model's: anything but http
    and https gets the package's own refusal, raised as a ValueError before the package is called; a failed
    or refused fetch is the package's error result."""
    if isinstance(url, str) and not url.startswith(("http://", "https://")):
        raise ValueError(f"Invalid URL: {url}")  # the package's words for it
    bfcl.official()  # its module imports the engine's client, which this puts in place
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code import web_search

    method = web_search.WebSearchAPI.fetch_url_content
    # the package's method as written, its `requests` the guarded one: nothing of the package is changed
    scope = {**vars(web_search), "requests": GuardedRequests(policy or egress.policy_from_env())}
    guarded = types.FunctionType(method.__code__, scope, method.__name__, method.__defaults__)
    return guarded(web_search.WebSearchAPI(), url, mode)


class GuardedRequests:
    """What the package's page fetch calls as `requests.get`: a GET through the egress guard, answered as a
    `requests` response (the body decoded by its headers, as `requests` decodes it)."""

    def __init__(self, policy: egress.FetchPolicy) -> None:
        self.policy = policy

    def get(self, url: str, headers: dict[str, str] | None = None, timeout: float = 20, **_: Any) -> Any:
        import requests
        from requests.structures import CaseInsensitiveDict
        from requests.utils import get_encoding_from_headers

        policy = dataclasses.replace(self.policy, connect_timeout_s=timeout, read_timeout_s=timeout)
        reply = egress.get_blocking(url, policy, headers)
        response = requests.Response()
        response.status_code, response.reason, response.url = reply.status, reply.reason, reply.url
        response.headers = CaseInsensitiveDict(reply.headers.items())
        response._content = reply.body
        response.encoding = get_encoding_from_headers(response.headers)
        return response
