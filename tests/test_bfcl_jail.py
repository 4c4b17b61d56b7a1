"""BFCL's multi-turn backends `eval()` the calls a model makes, built from its text; a model whose argument name
is `a=__import__('os').system(...),b` runs a command there. nanbeige runs that part of the official pipeline
in the sandbox's jail: such a model gets the official verdict, and the command reaches nothing outside.
Held against the official pipeline itself (`bfcl_oracle.py`), which runs the same command in its own process."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bfcl_oracle import Replies, block, official_verdicts, run_official, script_for
from fake_openai import FakeOpenAI
from fake_search_apis import FakeSerper
from fake_site import Site

from nanbeige.evals import bfcl
from nanbeige.evals.bfcl_jail import INSIDE

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bwrap, the sandbox's jail")
NANBEIGE = str(Path(sys.executable).with_name("nanbeige"))


def escaping(script: Replies, item_id: str, marker: Path) -> object:
    """The scripted model, but the first reply of `item_id` is a call whose argument name runs a command that
    writes `marker` where the official pipeline evaluates it."""
    attack = {"name": "ls", "arguments": {f"a=__import__('os').system('id > {marker}'),b": 1}}
    question = script.first_user(script.items[item_id][0])

    def model(request: dict) -> str:
        if question in request["prompt"] and "<tool_response>" not in request["prompt"]:
            return "<tool_call>\n" + json.dumps(attack) + "\n</tool_call>"
        return script(request)

    return model


def eval_command(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [NANBEIGE, "eval", *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}
    )


def one_item(bench: str, base_url: str, out: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`nanbeige eval BENCH` on its first item, with the model at `base_url`, into `out`."""
    return eval_command(bench, "--limit", "1", "--base-url", base_url, "--out", str(out), env=env)


def test_a_call_that_tries_to_escape_gets_the_official_verdict_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = script_for({"multi_turn_base": 2})
    marker = tmp_path / "escaped"
    with FakeOpenAI(escaping(script, "multi_turn_base_0", marker), vllm=True) as server:
        ours = eval_command(
            "bfcl-multi-turn-base", "--limit", "2", "--base-url", server.base_url, "--out", str(tmp_path / "out")
        )
        assert ours.returncode == 0, ours.stderr
        assert not marker.exists()  # generated and graded: the command never ran outside the sandbox
        official = run_official(server.base_url, {"multi_turn_base": 2}, tmp_path / "official", monkeypatch)
    assert marker.exists()  # the official pipeline ran it in its own process: the attack is real
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    expected = official_verdicts(official, ["multi_turn_base_0", "multi_turn_base_1"])
    assert {i: i not in report["wrong_ids"] for i in expected} == expected
    line = next(
        json.loads(x)
        for x in next((tmp_path / "out" / "bfcl" / "result").rglob("*.json")).open()
        if json.loads(x)["id"] == "multi_turn_base_0"
    )
    executed = [
        m["content"]
        for turn in line["inference_log"][1:2]
        for step in turn.values()
        for m in step
        if m.get("role") == "tool"
    ]
    assert executed and executed[0].startswith("Error during execution: ")  # `ls` refused the arguments, as upstream


def test_eval_report_on_a_handed_over_folder_grades_it_in_the_jail(tmp_path: Path) -> None:
    """A folder whose result file someone wrote: its multi-turn calls are run again to grade them."""
    script = script_for({"multi_turn_base": 2})
    with FakeOpenAI(script, vllm=True) as server:
        made = eval_command(
            "bfcl-multi-turn-base", "--limit", "2", "--base-url", server.base_url, "--out", str(tmp_path / "out")
        )
    assert made.returncode == 0, made.stderr
    marker = tmp_path / "escaped"
    result = next((tmp_path / "out" / "bfcl" / "result").rglob("*_result.json"))
    lines = [json.loads(x) for x in result.read_text().splitlines()]
    attack = {"name": "ls", "arguments": {f"a=__import__('os').system('id > {marker}'),b": 1}}
    lines[0]["result"][0][0] = "<tool_call>\n" + json.dumps(attack) + "\n</tool_call>"
    result.write_text("".join(json.dumps(line) + "\n" for line in lines))
    official = tmp_path / "official"
    shutil.copytree(tmp_path / "out" / "bfcl" / "result", official / "result")
    (tmp_path / "out" / "report.json").unlink()

    again = subprocess.run(
        [NANBEIGE, "eval", "report", str(tmp_path / "out")], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr
    assert not marker.exists()
    bfcl.fresh_state()
    bfcl.official().runner.main(
        [bfcl.HANDLER_ENTRY], ["multi_turn_base"], str(official / "result"), str(official / "score"), partial_eval=True
    )
    assert marker.exists()  # the official runner, in this process, ran the command
    expected = official_verdicts(official / "score", ["multi_turn_base_0", "multi_turn_base_1"])
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert {i: i not in report["wrong_ids"] for i in expected} == expected
    assert expected["multi_turn_base_0"] is False


def test_without_a_jail_multi_turn_is_refused_in_one_line_before_anything_runs(tmp_path: Path) -> None:
    failing = tmp_path / "bin"
    failing.mkdir()
    (failing / "bwrap").write_text("#!/bin/sh\necho 'bwrap: cannot make namespaces' >&2\nexit 1\n")
    (failing / "bwrap").chmod(0o755)
    script = script_for({"multi_turn_base": 1})
    with FakeOpenAI(script, vllm=True) as server:
        refused = one_item(
            "bfcl-multi-turn-base", server.base_url, tmp_path / "out", env={"PATH": f"{failing}:{os.environ['PATH']}"}
        )
        asked = len(server.requests)
    assert refused.returncode != 0 and asked == 0  # no item ran: not one completion was asked for
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert "bwrap" in line and "NANBEIGE_SANDBOX_JAIL=0" in line and "Traceback" not in refused.stderr


def browsing(page: str) -> object:
    """A model that searches, then reads the page it was told of twice (as Markdown and as text), then answers."""

    def model(request: dict) -> str:
        seen = request["prompt"].count("<tool_response>")
        if seen == 0:
            return block({"name": "search_engine_query", "arguments": {"keywords": "mars orbit"}})
        if seen == 1:
            return "\n".join(
                block({"name": "fetch_url_content", "arguments": {"url": page, "mode": mode}})
                for mode in ("markdown", "truncate")
            )
        return "{'answer': '687 days', 'context': 'from the page'}"

    return model


def test_a_web_search_item_reads_the_page_the_host_fetched_as_the_package_fetches_it(tmp_path: Path) -> None:
    """The jail has no network: the page the model asks for is fetched outside it, by the package's own
    `fetch_url_content` (its headers, its timeout, its Markdown and text conversions), so the model reads
    what it would read in the official pipeline."""
    with Site() as site:
        page = site.url("/article")
        found = {"mars orbit": [{"title": "The Orbit of Mars", "link": page, "snippet": "Mars orbits the Sun."}]}
        with FakeSerper(results=found) as serper, FakeOpenAI(browsing(page), vllm=True) as server:
            loopback = {**searching(serper), "NANBEIGE_ALLOW_PRIVATE_URLS": "1"}  # the test's site is on loopback
            ours = one_item("bfcl-web-search-base", server.base_url, tmp_path / "out", env=loopback)
            last = server.requests[-1]["prompt"]
        fetched = [headers for path, headers in site.requests if path == "/article"]
        bfcl.official()  # the package's modules import its engine's client, which this puts in place
        from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.web_search import WebSearchAPI

        official = {mode: WebSearchAPI().fetch_url_content(page, mode) for mode in ("markdown", "truncate")}
    assert ours.returncode == 0, ours.stderr
    assert len(fetched) == 2 and fetched[0]["User-Agent"].startswith("Mozilla/5.0")  # the package's own headers
    assert all("content" in result and "Mars" in result["content"] for result in official.values())
    for result in official.values():  # the tool responses the model read are the official fetch's, byte for byte
        assert json.dumps(result) in last


def test_a_page_the_model_names_is_fetched_only_over_http_and_https(tmp_path: Path) -> None:
    """The URL is the model's text: a file, another scheme or a redirect to a file gets an error, never the
    file; the refusal is the package's own (`Invalid URL: ...`), raised in the item as the package raises it."""
    from nanbeige.evals import bfcl_exchange
    from nanbeige.tools.egress import FetchPolicy

    secret = tmp_path / "secret.txt"
    secret.write_text("the user's private notes")
    local = FetchPolicy(allow_private=True)  # the test's site is on loopback: only the scheme is at stake here
    with Site() as site:
        for url in (f"file://{secret}", f"FILE://{secret}", f"ftp://127.0.0.1:{site.port}/x", "/etc/passwd"):
            with pytest.raises(ValueError, match="^Invalid URL: "):
                bfcl_exchange.fetch_page(url, "raw", local)
        redirected = bfcl_exchange.fetch_page(site.url(f"/redirect?to=file://{secret}"), "raw", local)
        assert site.requests  # the page was asked for: only the redirect's target was refused
    assert "error" in redirected and "private notes" not in json.dumps(redirected)


def test_every_hop_of_a_page_fetch_is_checked_after_resolving_its_name() -> None:
    """A name the operator allowed (an intranet host) is fetched; its redirect to a loopback address is not."""
    from nanbeige.evals import bfcl_exchange
    from nanbeige.tools.egress import FetchPolicy

    async def intranet(host: str) -> list[str]:
        return ["127.0.0.1"]

    policy = FetchPolicy(allowed_hosts=frozenset({"docs.intranet"}), resolve=intranet)
    with Site() as site:
        allowed = bfcl_exchange.fetch_page(f"http://docs.intranet:{site.port}/article", "truncate", policy)
        hop = bfcl_exchange.fetch_page(
            f"http://docs.intranet:{site.port}/redirect?to={site.url('/long.txt')}", "raw", policy
        )
        paths = [path for path, _ in site.requests]
    assert "Mars" in allowed["content"]
    assert "not a public address" in hop["error"] and "/long.txt" not in paths


def searching(serper: FakeSerper) -> dict[str, str]:
    return {"NANBEIGE_SEARCH_BACKEND": "serper", "SERPER_API_KEY": "test-key", "SERPER_BASE_URL": serper.url}


def test_a_page_on_a_loopback_address_is_never_fetched_for_the_model(tmp_path: Path) -> None:
    """The host fetches the pages a web search item's model names: one on this machine's loopback (a local
    admin page, a model server) is refused, and the model reads the refusal."""
    with Site() as site:
        page = site.url("/article")
        found = {"mars orbit": [{"title": "The Orbit of Mars", "link": page, "snippet": "Mars orbits the Sun."}]}
        with FakeSerper(results=found) as serper, FakeOpenAI(browsing(page), vllm=True) as server:
            ours = one_item(
                "bfcl-web-search-base",
                server.base_url,
                tmp_path / "out",
                env={**searching(serper), "NANBEIGE_ALLOW_PRIVATE_URLS": "0"},
            )
            last = server.requests[-1]["prompt"]
        paths = [path for path, _ in site.requests]
    assert ours.returncode == 0, ours.stderr
    assert "/article" not in paths
    assert "not a public address" in last


def test_the_page_fetch_in_the_sandbox_takes_the_packages_own_arguments() -> None:
    import inspect

    bfcl.official()
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.web_search import WebSearchAPI

    inside = importlib.util.module_from_spec(importlib.util.spec_from_file_location("inside", INSIDE))
    inside.__spec__.loader.exec_module(inside)  # type: ignore[union-attr]

    def arguments(function: object) -> list:  # names, kinds and defaults: what a call the model makes binds to
        return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]

    assert arguments(inside.fetch_url_content) == arguments(WebSearchAPI.fetch_url_content)


def test_a_memory_snapshot_is_never_written_through_a_link_made_while_the_eval_runs(tmp_path: Path) -> None:
    """A link in the folder is refused before an eval starts; one made during it (by whoever shares the
    folder) still cannot lead a snapshot the sandbox sent out of the result folder."""
    from nanbeige.evals import bfcl_jail
    from nanbeige.tools.sandbox import SandboxError

    result, outside = tmp_path / "result", tmp_path / "outside"
    outside.mkdir()
    (result / bfcl.model_dir()).mkdir(parents=True)
    (result / bfcl.model_dir() / "memory_snapshot").symlink_to(outside)
    name = f"{bfcl.model_dir()}/memory_snapshot/kv/item.json"
    with pytest.raises(SandboxError, match="symbolic link"):
        bfcl_jail.write_snapshots({name: "{}"}, {}, result)
    assert list(outside.iterdir()) == []
