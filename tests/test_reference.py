"""`--reference PATH`: the model reads the reference harness's own texts, read from a checkout of it.

The checkout here is `reference_tree.py`'s: MiroThinker's files, names and code shapes holding our
own placeholder texts, so each text can be followed from the checkout to the model byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fake_openai import mcp_answer, mcp_call
from reference_tree import make_reference

from nanbeige.agent.backends.scripted import ScriptedLLM
from nanbeige.agent.cli.resume import check_unchanged
from nanbeige.agent.reference import checkout as ref
from nanbeige.agent.run.loop import AgentConfig, run
from nanbeige.agent.setup.setup_checks import SetupError
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter, load_trajectories

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
SYSTEM = (  # the tree's system prompt for one tool-python tool, as its own functions assemble it
    "PLACEHOLDER-PREAMBLE with a trailing space. \n\nDate line: 2026-11-21\n\n# PLACEHOLDER-FORMAT \n"
    "\n## Server name: tool-python\n"
    "### Tool name: run_python_code\n"
    "Description: PLACEHOLDER-RUN-PYTHON-CODE\n    second line, indented.\n    \n"
    "Input JSON schema: {'properties': {'code_block': {'title': 'Code Block', 'type': 'string'}}, "
    "'required': ['code_block'], 'type': 'object'}\n"
    "\n# PLACEHOLDER-GENERAL\n\nPLACEHOLDER-GENERAL-TEXT\n\n"
    "# PLACEHOLDER-MAIN-OBJECTIVE\n\nPLACEHOLDER-MAIN-TEXT"
)
RUN_PYTHON = {
    "server": "tool-python",
    "name": "run_python_code",
    "description": "ours",
    "input_schema": {
        "type": "object",
        "properties": {"code_block": {"type": "string", "title": "Code Block"}},
        "required": ["code_block"],
    },
}


def test_the_system_prompt_is_the_checkouts_own_with_its_tool_descriptions(tmp_path: Path) -> None:
    reference = ref.load(make_reference(tmp_path))
    assert reference.system_prompt([RUN_PYTHON], "2026-11-21") == SYSTEM
    # a tool the reference does not have keeps our description
    mine = {**RUN_PYTHON, "server": "mine", "name": "lookup"}
    assert "### Tool name: lookup\nDescription: ours\n" in reference.system_prompt([RUN_PYTHON, mine], "2026-11-21")


@pytest.mark.anyio
async def test_every_text_reaches_the_model_exactly(tmp_path: Path) -> None:
    """The system prompt, the user message, a duplicate-query note and the summary prompt, each as the
    checkout's code builds it; a refusal phrase of the checkout's is rolled back."""
    from mcp.server.mcpserver import MCPServer

    reference = ref.load(make_reference(tmp_path / "miro"))
    web = MCPServer(name="search_and_scrape_webpage")

    @web.tool()
    def google_search(q: str) -> str:
        return f"results for {q}"

    search = mcp_call("search_and_scrape_webpage", "google_search", {"q": "mars"})
    llm = ScriptedLLM([search, "PLACEHOLDER-REFUSAL", search, mcp_answer("red"), mcp_answer("red")])
    path = tmp_path / "run.jsonl"
    writer = TrajectoryWriter(path)
    async with Toolbox([ServerSpec(name="search_and_scrape_webpage", server=web)]) as tools:
        trajectory = await run("Which colour?", llm, tools, AgentConfig(date="2026-11-21", reference=reference), writer)
    writer.close()
    system, user = llm.calls[0][:2]
    assert system["content"].startswith("PLACEHOLDER-PREAMBLE with a trailing space. \n\nDate line: 2026-11-21\n")
    assert "### Tool name: google_search\nDescription: PLACEHOLDER-GOOGLE-SEARCH\n" in system["content"]
    assert user["content"] == "Which colour?\nPLACEHOLDER-SUFFIX in \\boxed{}."
    assert trajectory.turns[1].rolled_back and "refused" in trajectory.turns[1].format_error
    assert llm.calls[3][-1]["content"] == "PLACEHOLDER-DUPLICATE 'mars' via google_search."
    assert (
        llm.calls[-1][-1]["content"]
        == 'PLACEHOLDER-SUMMARY-HEAD\n\n"Which colour?"\n\nPLACEHOLDER-SUMMARY-RULES \\boxed{}.'
    )
    [start] = [json.loads(line) for line in path.read_text().splitlines()[:1]]
    assert start["reference"] == {"commit": None, "sha256": reference.sha256, "python": "3.12"}
    assert load_trajectories(path)[0].reference == reference.identity()


@pytest.mark.anyio
async def test_a_later_checkout_rolls_a_repeated_query_back_instead_of_answering_it(tmp_path: Path) -> None:
    from mcp.server.mcpserver import MCPServer

    reference = ref.load(make_reference(tmp_path, head=True))
    assert reference.duplicate_query is None
    web = MCPServer(name="jina_scrape_llm_summary")

    @web.tool()
    def scrape_and_extract_info(url: str, info_to_extract: str) -> str:
        return f"{info_to_extract} of {url}"

    def scrape(info: str) -> str:
        return mcp_call(
            "jina_scrape_llm_summary", "scrape_and_extract_info", {"url": "http://127.0.0.1/a", "info_to_extract": info}
        )

    llm = ScriptedLLM([scrape("title"), scrape("title"), scrape("date"), mcp_answer("x"), mcp_answer("x")])
    async with Toolbox([ServerSpec(name="jina_scrape_llm_summary", server=web)]) as tools:
        trajectory = await run("q", llm, tools, AgentConfig(date="2026-11-21", reference=reference))
    assert [t.rolled_back for t in trajectory.turns] == [False, True, False, False, False]
    assert "repeats a query" in trajectory.turns[1].format_error
    assert [r.text for t in trajectory.turns for r in t.tool_results] == [
        "title of http://127.0.0.1/a",
        "date of http://127.0.0.1/a",
    ]
    # after 4 replies in a row were dropped, a repeat runs (the reference lets it through)
    llm = ScriptedLLM([scrape("title")] + ["PLACEHOLDER-REFUSAL"] * 4 + [scrape("title"), mcp_answer("x")] * 2)
    async with Toolbox([ServerSpec(name="jina_scrape_llm_summary", server=web)]) as tools:
        trajectory = await run("q", llm, tools, AgentConfig(date="2026-11-21", reference=reference))
    assert [t.rolled_back for t in trajectory.turns[:6]] == [False, True, True, True, True, False]


def test_the_checkouts_settings_and_identity_are_read(tmp_path: Path) -> None:
    reference = ref.load(make_reference(tmp_path, git=True))
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert reference.commit == head and len(reference.sha256) == 64
    assert reference.settings == {
        "temperature": 0.3,
        "top_p": 0.95,
        "max_tokens": 16384,
        "keep_tool_result": 5,
        "max_context_length": 262144,
        "max_turns": 600,
    }
    assert reference.extraction_prompt == "PLACEHOLDER-EXTRACT want: {} from: {}"
    assert reference.tool_descriptions[("tool-python", "create_sandbox")].startswith(
        "PLACEHOLDER-CREATE-SANDBOX\n\n    Args:"
    )
    assert ("tool-python", "helper") not in reference.tool_descriptions  # not registered as a tool
    # one changed byte in any file read changes the hash
    prompts = tmp_path / ref.FILES["prompts"]
    prompts.write_text(prompts.read_text().replace("PLACEHOLDER-MAIN-TEXT", "PLACEHOLDER-MAIN-TEXt"))
    assert ref.load(tmp_path).sha256 != reference.sha256


def test_a_checkout_missing_a_text_is_refused_naming_what_is_missing(tmp_path: Path) -> None:
    root = make_reference(tmp_path)
    (root / ref.FILES["orchestrator"]).unlink()
    (root / ref.FILES["jina_scrape_llm_summary"]).write_text("EXTRACT_INFO_PROMPT = 'no fields'\n")
    with pytest.raises(ref.ReferenceError) as caught:
        ref.load(root)
    message = str(caught.value)
    assert "\n" not in message and "orchestrator.py" in message and "EXTRACT_INFO_PROMPT" in message


def test_prompt_functions_that_import_beyond_the_standard_library_are_never_run(tmp_path: Path) -> None:
    root = make_reference(tmp_path)
    marker = tmp_path / "ran"
    prompts = root / ref.FILES["prompts"]
    prompts.write_text(f"import httpx\nopen({str(marker)!r}, 'w').close()\n" + prompts.read_text())
    with pytest.raises(ref.ReferenceError, match="imports httpx"):
        ref.load(root)
    assert not marker.exists()


@pytest.mark.parametrize("module", ["subprocess", "socket", "urllib.request", "importlib"])
def test_prompt_functions_that_import_what_starts_programs_or_connects_are_never_run(
    tmp_path: Path, module: str
) -> None:
    root = make_reference(tmp_path)
    marker = tmp_path / "ran"
    prompts = root / ref.FILES["prompts"]
    prompts.write_text(f"import {module}\nopen({str(marker)!r}, 'w').close()\n" + prompts.read_text())
    with pytest.raises(ref.ReferenceError, match=f"imports {module}"):
        ref.load(root)
    assert not marker.exists()


def test_reference_check_says_what_was_understood(tmp_path: Path) -> None:
    root = make_reference(tmp_path)
    done = subprocess.run([NANBEIGE, "reference", "check", str(root)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(line.startswith("✓") for line in lines[:-1]) and lines[-1].startswith("sha256 ")
    assert any("duplicate-query rule: a note answers" in line for line in lines)
    (root / ref.FILES["input"]).write_text("x = 1\n")
    done = subprocess.run([NANBEIGE, "reference", "check", str(root)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "✗ user message" in done.stdout
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_ask_refuses_a_checkout_it_cannot_read_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [NANBEIGE, "ask", "q", "--reference", str(tmp_path), "--base-url", "http://127.0.0.1:9/v1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--reference" in done.stderr and "prompt_utils.py" in done.stderr


def test_resume_refuses_a_checkout_that_changed_since_the_run(tmp_path: Path) -> None:
    from nanbeige.agent.trajectory.trajectory import Trajectory

    reference = ref.load(make_reference(tmp_path))
    trajectory = Trajectory(question="q", reference=reference.identity())
    check_unchanged(trajectory, _NoTokenizer(), [], reference)  # the same texts: fine
    (tmp_path / ref.FILES["input"]).write_text((tmp_path / ref.FILES["input"]).read_text() + "\n")
    with pytest.raises(SetupError, match="changed"):
        check_unchanged(trajectory, _NoTokenizer(), [], ref.load(tmp_path))
    with pytest.raises(SetupError):
        check_unchanged(trajectory, _NoTokenizer(), [], None)


class _NoTokenizer:
    tokenizer_identity = None
    template_identity = None


@pytest.mark.anyio
async def test_a_checkout_whose_note_covers_page_extractions_answers_their_repeats_too(tmp_path: Path) -> None:
    from mcp.server.mcpserver import MCPServer

    assert ref.load(make_reference(tmp_path / "v1")).query_tools == ("google_search",)
    reference = ref.load(make_reference(tmp_path / "later", scrape_repeats=True))
    assert reference.query_tools == ("google_search", "scrape_and_extract_info")
    web = MCPServer(name="jina_scrape_llm_summary")

    @web.tool()
    def scrape_and_extract_info(url: str, info_to_extract: str) -> str:
        return f"{info_to_extract} of {url}"

    scrape = mcp_call(
        "jina_scrape_llm_summary", "scrape_and_extract_info", {"url": "http://127.0.0.1/a", "info_to_extract": "title"}
    )
    llm = ScriptedLLM([scrape, scrape, mcp_answer("x"), mcp_answer("x")])
    async with Toolbox([ServerSpec(name="jina_scrape_llm_summary", server=web)]) as tools:
        trajectory = await run("q", llm, tools, AgentConfig(date="2026-11-21", reference=reference))
    assert (
        trajectory.turns[1].tool_results[0].text
        == "PLACEHOLDER-DUPLICATE 'http://127.0.0.1/a_title' via scrape_and_extract_info."
    )


def test_the_page_extraction_prompt_reaches_the_scrape_server_and_the_extraction_model(tmp_path: Path) -> None:
    from nanbeige.agent.backends.llm import LLMConfig
    from nanbeige.agent.setup.setup import default_servers
    from nanbeige.tools.scrape import extraction_prompt, scrape_config_from_env

    reference = ref.load(make_reference(tmp_path))
    [scrape] = [
        s
        for s in default_servers(LLMConfig(), lambda _: None, reference=reference)
        if s.name == "jina_scrape_llm_summary"
    ]
    config = scrape_config_from_env(scrape.env)
    assert extraction_prompt("PAGE", "INFO", config.extraction_prompt) == "PLACEHOLDER-EXTRACT want: INFO from: PAGE"
    [scrape] = [s for s in default_servers(LLMConfig(), lambda _: None) if s.name == "jina_scrape_llm_summary"]
    assert scrape_config_from_env(scrape.env).extraction_prompt is None  # ours, without a reference


def test_tool_descriptions_follow_the_python_the_reference_ran_on(tmp_path: Path) -> None:
    root = make_reference(tmp_path)
    raw = ref.load(root).tool_descriptions[("tool-python", "run_python_code")]
    stripped = ref.load(root, python="3.13").tool_descriptions[("tool-python", "run_python_code")]
    assert raw == "PLACEHOLDER-RUN-PYTHON-CODE\n    second line, indented.\n    "  # as Python 3.12 keeps __doc__
    assert stripped == "PLACEHOLDER-RUN-PYTHON-CODE\nsecond line, indented.\n"  # as 3.13's compiler stores it
    assert ref.load(root, python="3.13").identity()["python"] == "3.13"
    report, reference = ref.inspect(root, python="3.11")
    assert reference is None and "not one of 3.12, 3.13" in report[0][2]


@pytest.mark.parametrize(
    ("raw", "stored"),
    [  # what CPython 3.13 stored for these docstrings
        ("x\n      six\n    four\n          ten\n  \n        \n    ", "x\n  six\nfour\n      ten\n\n    \n"),
        ("\n    Leading newline.\n        more\n    ", "\nLeading newline.\n    more\n"),
        ("\ttab first\n\ttabbed line\n    four", "tab first\n    tabbed line\nfour"),
        ("two\n\nlines no indent\n    ", "two\n\nlines no indent\n    "),
        ("one line", "one line"),
    ],
)
def test_docstrings_are_cleaned_as_python_3_13_compiles_them(raw: str, stored: str) -> None:
    assert ref.compiled_docstring(raw) == stored


def test_an_odd_checkout_is_refused_or_read_never_a_traceback_or_a_hang(tmp_path: Path) -> None:
    import os

    root = make_reference(tmp_path / "tags")
    prompts = root / ref.FILES["prompts"]
    prompts.write_text(prompts.read_text().replace("mcp_tags = [", "mcp_tags = {[1]: 2}\nunused = ["))
    with pytest.raises(ref.ReferenceError, match="mcp_tags is not a literal"):
        ref.load(root)

    root = make_reference(tmp_path / "exits")
    prompts = root / ref.FILES["prompts"]
    prompts.write_text("raise SystemExit(3)\n" + prompts.read_text())
    with pytest.raises(ref.ReferenceError, match="SystemExit"):
        ref.load(root)

    root = make_reference(tmp_path / "fifo")
    (root / ref.FILES["input"]).unlink()
    os.mkfifo(root / ref.FILES["input"])  # reading it would block forever
    with pytest.raises(ref.ReferenceError, match="not a regular file"):
        ref.load(root)

    root = make_reference(tmp_path / "git")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_bytes(b"\xff\xfe not text")
    assert ref.load(root).commit is None  # an unreadable HEAD names no commit; the texts still load


@pytest.mark.anyio
async def test_a_later_checkout_rolls_back_a_reply_that_repeats_a_query_within_itself(tmp_path: Path) -> None:
    from mcp.server.mcpserver import MCPServer

    reference = ref.load(make_reference(tmp_path, head=True))
    web = MCPServer(name="search_and_scrape_webpage")

    @web.tool()
    def google_search(q: str) -> str:
        return f"results for {q}"

    one = mcp_call("search_and_scrape_webpage", "google_search", {"q": "mars"})
    llm = ScriptedLLM([one + "\n" + one, one, mcp_answer("x"), mcp_answer("x")])
    async with Toolbox([ServerSpec(name="search_and_scrape_webpage", server=web)]) as tools:
        trajectory = await run("q", llm, tools, AgentConfig(date="2026-11-21", reference=reference))
    assert [t.rolled_back for t in trajectory.turns[:2]] == [True, False]


@pytest.mark.anyio
async def test_a_later_checkout_asks_for_the_summary_again_when_it_has_no_boxed_answer(tmp_path: Path) -> None:
    assert ref.load(make_reference(tmp_path / "v1")).summary_tries == (1, 1)
    reference = ref.load(make_reference(tmp_path / "head", head=True))
    assert reference.summary_tries == (3, 1)
    replies = ["I have no idea.", "Still none.", mcp_answer("7")]
    llm = ScriptedLLM([mcp_answer("5"), *replies])
    trajectory = await run("q", llm, None, AgentConfig(date="2026-11-21", reference=reference, keep_tool_results=-1))
    summaries = trajectory.turns[1:]
    assert [t.rolled_back for t in summaries] == [True, True, False] and trajectory.answer == "7"
    assert llm.calls[1] == llm.calls[2] == llm.calls[3]  # each try asked again from the same messages
    trajectory = await run(
        "q", ScriptedLLM([mcp_answer("5"), *replies]), None, AgentConfig(date="2026-11-21", reference=reference)
    )
    assert len(trajectory.turns) == 2 and trajectory.answer == "5"  # keep-5: one try, then the run's latest box


def test_the_checkouts_sampling_fills_only_what_the_user_left_unset(tmp_path: Path) -> None:
    from nanbeige.agent.backends.llm import LLMConfig
    from nanbeige.agent.run.run_config import RunSettings
    from nanbeige.agent.setup.setup_checks import with_reference

    reference = ref.load(make_reference(tmp_path))
    settings = with_reference(RunSettings(llm=LLMConfig(top_p=0.5)), reference)
    assert (settings.llm.temperature, settings.llm.top_p, settings.llm.repetition_penalty) == (0.3, 0.5, None)
    assert settings.agent.reference is reference
    tool_call = with_reference(RunSettings(agent=AgentConfig(dialect="tool-call")), reference)
    assert tool_call.llm.temperature is None  # the reference's settings are for its own (mcp-xml) runs


def test_placeholder_sandbox_ids_get_the_checkouts_own_answer_from_our_python_server(tmp_path: Path) -> None:
    from nanbeige.agent.backends.llm import LLMConfig
    from nanbeige.agent.setup.setup import default_servers
    from nanbeige.tools.sandbox import SandboxError, Sandboxes, config_from_env

    reference = ref.load(make_reference(tmp_path))
    assert reference.placeholder_ids == {"default", "placeholder-box"}
    [python] = [s for s in default_servers(LLMConfig(), lambda _: None, reference=reference) if s.name == "tool-python"]
    config = config_from_env({**python.env, "NANBEIGE_SANDBOX_DIR": str(tmp_path / "boxes")})
    boxes = Sandboxes(config, backend=object())  # a placeholder is answered before any backend is asked
    with pytest.raises(SandboxError) as caught:
        boxes.run_python("1", "placeholder-box")
    assert str(caught.value) == "PLACEHOLDER-INVALID {'placeholder-box'} id."  # the server adds `[ERROR]: `
    with pytest.raises(SandboxError, match="is not a valid sandbox_id"):
        boxes.run_command("true", "")  # not the checkout's placeholder: our own answer


def test_reference_graders_put_the_checkouts_own_judge_prompts_in_front_of_the_judge(tmp_path: Path) -> None:
    """The evaluator's templates, filled by `str.format` as it fills them; a template with other fields, or
    not a plain text, is left out (our prompt is used for that judge), as is a checkout without an evaluator."""
    from nanbeige.evals.judges import profile_for, request_body

    root = make_reference(tmp_path / "ref")
    prompts = ref.load(root).judge_prompts
    assert set(prompts) == {"hle", "browsecomp"}  # BC-ZH has an extra field; the equivalent one is an f-string
    assert prompts["browsecomp"] == "PLACEHOLDER-BC-EN q={question} a={correct_answer} r={response}"  # .strip()
    body = request_body(profile_for("hle/reference", None, prompts), "judge", "Q?", "{r}", "Paris")
    assert body["messages"][-1]["content"] == "PLACEHOLDER-HLE-JUDGE q=Q? r={r} a=Paris {kept}"
    assert profile_for("hle/official", None, prompts).template == profile_for("hle/official").template
    assert profile_for("equivalent/reference", None, prompts).template == profile_for("equivalent/reference").template
    (root / "apps/miroflow-agent/benchmarks/evaluators/eval_utils.py").unlink()
    report, reference = ref.inspect(root)
    assert reference is not None and reference.judge_prompts == {}
    assert any(name == "judge prompts" and ok and "nanbeige's prompts" in detail for name, ok, detail in report)
