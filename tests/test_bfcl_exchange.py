"""What the host answers a BFCL item's sandbox, question by question (`evals/bfcl_exchange.py`), with the
package's own handler counting and decoding. The model's code shares the sandbox's process with the package's,
so the host judges a question by what it served, never by who seems to send it. Through a real jail, with the
model's code writing the questions, in `test_bfcl_jail.py`."""

from __future__ import annotations

from typing import Any

import pytest
from bfcl_oracle import block

from nanbeige.evals import bfcl, bfcl_exchange


class Words:
    def tokenize(self, text: str) -> list[str]:
        return text.split()


def item_host(replies: list[str]) -> tuple[bfcl_exchange.ItemHost, list[str]]:
    """The host's side of a two-turn item whose model gives `replies` in turn; the prompts it was asked."""
    asked: list[str] = []

    def complete(prompt: str, max_tokens: int, temperature: float) -> tuple[str, int, int]:
        asked.append(prompt)
        return replies[len(asked) - 1], 10, 5

    handler = bfcl.handler_for(Words(), 32768, "model", bfcl.TEMPERATURE)
    entry = {"id": "web_search_base_0", "question": [[{"role": "user", "content": "a"}], []]}
    return bfcl_exchange.host_answers(bfcl.Completions(complete), handler, entry), asked


def completion(host: bfcl_exchange.ItemHost, prompt: str, **settings: Any) -> dict[str, Any]:
    """A completion asked as the package asks it: the prompt counted, then asked for."""
    host({"tokenize": prompt})
    call = {"prompt": prompt, "max_tokens": 4096, "temperature": bfcl.TEMPERATURE} | settings
    return host({"complete": call})


def test_a_completion_is_served_only_as_the_package_asks_for_one() -> None:
    host, asked = item_host(["first", "second"])
    assert host({"tokenize": "one two three"}) == {"count": 3}
    assert completion(host, "the prompt")["text"] == "first"
    with pytest.raises(bfcl_exchange.Refused, match="had not counted"):
        host({"complete": {"prompt": "never counted", "max_tokens": 10, "temperature": bfcl.TEMPERATURE}})
    with pytest.raises(bfcl_exchange.Refused, match="settings the package does not use"):
        completion(host, "hotter", temperature=1.5)
    with pytest.raises(bfcl_exchange.Refused, match="settings the package does not use"):
        completion(host, "longer", max_tokens=100_000)
    assert asked == ["the prompt"]  # nothing refused reached the model


def test_a_search_or_a_page_is_answered_once_for_each_call_of_the_last_reply() -> None:
    search = {"name": "search_engine_query", "arguments": {"keywords": "mars moons"}}
    fetch = {"name": "fetch_url_content", "arguments": {"url": "file:///etc/passwd"}}
    host, _ = item_host([block(search) + "\n" + block(fetch), "no calls now"])
    completion(host, "prompt one")
    assert "result" in host({"search": {"q": "mars moons", "engine": "duckduckgo"}})
    assert host({"fetch": {"url": "file:///etc/passwd", "mode": "raw"}}) == {"raise": "Invalid URL: file:///etc/passwd"}
    for again in ({"search": {"q": "mars moons"}}, {"fetch": {"url": "file:///etc/passwd", "mode": "raw"}}):
        with pytest.raises(bfcl_exchange.Refused, match="did not ask for"):
            host(again)  # each call once
    completion(host, "prompt two")
    with pytest.raises(bfcl_exchange.Refused, match="did not ask for"):
        host({"fetch": {"url": "http://example.com/", "mode": "raw"}})  # the new reply asked for nothing


def test_a_result_line_is_recorded_only_with_the_replies_served() -> None:
    host, _ = item_host(["<think>\nhm\n</think>\n\nfirst answer", "second answer"])
    completion(host, "prompt one")
    completion(host, "prompt two")
    served = {"id": "web_search_base_0", "result": [["first answer"], ["second answer"]]}
    assert host.result(served) == served
    for forged in (
        [["first answer", "second answer", "the ground truth"]],
        [["the ground truth"], ["second answer"]],
        [["first answer"], ["second answer"], []],
        "the ground truth",
    ):
        with pytest.raises(bfcl_exchange.Refused, match="not the ones the model gave"):
            host.result({"id": "web_search_base_0", "result": forged})
    error = {"id": "web_search_base_0", "result": "Error during inference: the handler raised"}
    assert host.result(error) == error  # it scores nothing whoever wrote it
