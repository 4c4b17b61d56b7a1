"""`trainer.judge` and `trainer.critic`: outcome rewards from the evals' graders, a turn critic behind a
loopback OpenAI-compatible server, the turn rule checked by hand, and the out file (whole trajectories,
token fields untouched, resumable)."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import free_port
from fake_openai import FakeOpenAI, Reply
from test_cli import nanbeige

from nanbeige.agent.trajectory import ToolCall, ToolResult, Trajectory, Turn
from nanbeige.agent.trajectory_file import TrajectoryWriter, load_trajectories, read_records
from nanbeige.evals.judges import JUDGE_ENDPOINT
from nanbeige.trainer.critic import CRITIC_ENDPOINT, MalformedCritique, TurnRule, parse_scores, turn_outcome
from nanbeige.trainer.rewards import JudgeError, JudgeProgress, JudgeRunConfig, judge_file

QUESTION = "What is the capital of France?"
TOKEN_FIELDS = ("segment", "prompt_keep", "prompt_delta_ids", "prefix_hash", "completion_ids", "logprobs")
# Critic scores (logical soundness, tool-call accuracy, information gain) by the marker in a turn's reasoning.
SCORES = {"THINK-0": (5, 4, 3), "THINK-1": (2, 5, 5), "THINK-3": (3, None, None)}


# ---------------------------------------------------------------- hand-made trajectories


def token_fields(index: int) -> dict[str, Any]:
    """Token records with floats that only survive an exact round trip."""
    return {"segment": 0, "prompt_keep": 10 * index, "prompt_delta_ids": [151644 + index, 8948, 198, 0],
            "prefix_hash": f"{index:064x}", "completion_ids": [1, 22, 333, 4444 + index],
            "logprobs": [-0.1234567890123457, -1e-07, 0.0, -3.3333333333333335 - index]}


def tool_turn(index: int, server: str, tool: str, arguments: dict[str, Any], result: str) -> Turn:
    content = f"<think>\nTHINK-{index}: the next thing to look up.\n</think>\n\n<use_mcp_tool>...</use_mcp_tool>"
    return Turn(index=index, assistant={"role": "assistant", "content": content},
                tool_calls=[ToolCall(server, tool, arguments)], tool_results=[ToolResult(result, latency_s=0.5)],
                finish_reason="stop", usage={"prompt_tokens": 100, "completion_tokens": 20}, **token_fields(index))


def standard_turns() -> list[Turn]:
    """A search, a scrape, a rolled-back refusal and the summary turn with the boxed answer."""
    return [
        tool_turn(0, "search_and_scrape_webpage", "google_search", {"q": "capital of France"},
                  "Paris is the capital and largest city of France."),
        tool_turn(1, "jina_scrape_llm_summary", "scrape_and_extract_info",
                  {"url": "https://example.org/paris", "info_to_extract": "capital"}, "The page confirms: Paris."),
        Turn(index=2, assistant={"role": "assistant", "content": "<think>THINK-2</think> I'm sorry, I cannot solve"},
             format_error="rolled back: the reply refused the task", rolled_back=True, **token_fields(2)),
        Turn(index=3, assistant={"role": "assistant",
                                 "content": "<think>\nTHINK-3: both sources agree.\n</think>\n\n\\boxed{Paris}"},
             instruction="Give the final answer now.", **token_fields(3)),
    ]


def make(id: str, answer: str | None = "Paris", reference: str | None = "Paris", grader: str | None = "gaia-exact",
         stop_reason: str | None = "answered", question: str = QUESTION) -> Trajectory:
    return Trajectory(question=question, id=id, group_id="q1", rollout_index=0, reference_answer=reference,
                      grader=grader, model="policy", turns=standard_turns(), answer=answer,
                      stop_reason=stop_reason)  # type: ignore[arg-type]


def write(path: Path, trajectories: list[Trajectory], finished: bool = True) -> Path:
    writer = TrajectoryWriter(path)
    for trajectory in trajectories:
        writer.start(trajectory)
        for turn in trajectory.turns:
            writer.turn(trajectory, turn)
        if finished and trajectory.stop_reason is not None:
            writer.end(trajectory)
    writer.close()
    return path


# ---------------------------------------------------------------- a scripted critic


def rating(scores: tuple[int | None, int | None, int | None]) -> dict[str, Any]:
    names = ("logical_soundness", "tool_call_accuracy", "information_gain")
    return {name: None if score is None else {"score": score, "reason": f"{name} is {score}"}
            for name, score in zip(names, scores)}


def prompt_of(request: dict[str, Any]) -> str:
    return request["messages"][-1]["content"]


def marker(request: dict[str, Any]) -> str:
    found = re.search(r"THINK-\d", prompt_of(request))
    assert found, "every critic prompt shows the turn's reasoning"
    return found.group(0)


def critic_replies(request: dict[str, Any]) -> str:
    return json.dumps(rating(SCORES[marker(request)]))


def config(server: FakeOpenAI | None, rule: TurnRule | None = None, **critic: Any) -> JudgeRunConfig:
    settings = replace(CRITIC_ENDPOINT, base_url=server.base_url, model="critic-model", retries=2, retry_wait_s=0.0,
                       **critic) if server else None
    return JudgeRunConfig(critic=settings, rule=rule or TurnRule(), concurrency=4, no_critic=server is None)


# ---------------------------------------------------------------- the rule, by hand


def test_turn_outcome_by_hand() -> None:
    mask, penalise = TurnRule(), TurnRule(failed="penalise", penalty=0.5)
    scores = dict(logical_soundness=5, tool_call_accuracy=4, information_gain=3)
    assert turn_outcome(scores, mask) == (0.75, 1, True)  # ((5-1) + (4-1) + (3-1)) / 4 / 3
    assert turn_outcome(scores, penalise) == (0.75, 1, True)
    assert turn_outcome(dict(logical_soundness=3, tool_call_accuracy=3, information_gain=3), mask) == (0.5, 1, True)
    failing = dict(logical_soundness=5, tool_call_accuracy=2, information_gain=5)
    assert turn_outcome(failing, mask) == (None, 0, False)
    assert turn_outcome(failing, penalise) == (-0.5, 1, False)
    assert turn_outcome(failing, TurnRule(failed="penalise")) == (-1.0, 1, False)
    answer_turn = dict(logical_soundness=4, tool_call_accuracy=None, information_gain=None)
    assert turn_outcome(answer_turn, mask) == (0.75, 1, True)  # the unscored two count as passing
    assert turn_outcome(dict(answer_turn, logical_soundness=1), mask) == (None, 0, False)
    lenient = TurnRule(min_information_gain=1)
    assert turn_outcome(dict(logical_soundness=5, tool_call_accuracy=5, information_gain=1), lenient) == \
        (2 / 3, 1, True)


def test_critic_replies_are_read_robustly() -> None:
    body = json.dumps(rating((4, 3, 2)))
    for text in (body, f"Here is my rating:\n```json\n{body}\n```\nHope this helps.",
                 f"<think>maybe {{\"x\": 1}}</think>{body}", body[:-2]):  # the last one is cut off: repaired
        assert parse_scores(text, tool_turn=True)["information_gain"] == {"score": 2, "reason": "information_gain is 2"}
    assert parse_scores('{"logical_soundness": 4}', tool_turn=False) == \
        {"logical_soundness": {"score": 4, "reason": ""}, "tool_call_accuracy": None, "information_gain": None}
    for bad in ("no json here", json.dumps(rating((7, 3, 3))), json.dumps(rating((4, 0, 3))),
                '{"logical_soundness": {"score": 4}, "tool_call_accuracy": {"score": 4}}',
                '{"logical_soundness": {"score": true}}', '{"logical_soundness": {"score": 3.5}}'):
        with pytest.raises(MalformedCritique):
            parse_scores(bad, tool_turn=True)


# ---------------------------------------------------------------- outcome rewards


@pytest.mark.anyio
async def test_outcome_reward_with_gaia_exact_and_without_a_reference(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [make("right", answer="paris"), make("wrong", answer="Lyon"),
                                        make("none", answer=None), make("unknown", reference=None)])
    result = await judge_file(src, tmp_path / "out.jsonl", config(None))
    judged = {t.id: t for t in load_trajectories(tmp_path / "out.jsonl")}
    assert {k: t.reward for k, t in judged.items()} == {"right": 1.0, "wrong": 0.0, "none": 0.0, "unknown": None}
    assert judged["right"].judge == {"grader": "gaia-exact", "judge_model": None, "correct": True,
                                     "extracted": "paris", "reason": "", "error": None}
    assert judged["wrong"].judge["correct"] is False and "'Lyon'" in judged["wrong"].judge["reason"]
    assert judged["unknown"].judge == {"error": "no reference answer"}
    assert result["judged"] == 4 and result["rewarded"] == 3 and result["mean_reward"] == round(1 / 3, 4)
    assert result["outcome_errors"] == 1 and result["turns_judged"] == 0


@pytest.mark.anyio
async def test_a_judge_profile_grades_and_an_undecided_judge_gives_no_reward(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from nanbeige.evals import judges

    # the reference harness waits 5 s between its 10 tries for a verdict; not here
    monkeypatch.setitem(judges.PROFILES, "equivalent/reference", replace(judges.PROFILES["equivalent/reference"],
                                                                         wait_s=0.0))

    def judge(request: dict[str, Any]) -> str:
        return "Correct" if "Predicted answer: The city of Paris" in prompt_of(request) else "Perhaps."

    src = write(tmp_path / "in.jsonl", [make("yes", answer="The city of Paris"), make("undecided", answer="Lutetia")])
    with FakeOpenAI(judge) as server:
        run = config(None)
        run.grader = "equivalent/reference"
        run.judge = replace(JUDGE_ENDPOINT, base_url=server.base_url, model="judge-model", retries=1, retry_wait_s=0.0)
        await judge_file(src, tmp_path / "out.jsonl", run)
    judged = {t.id: t for t in load_trajectories(tmp_path / "out.jsonl")}
    assert judged["yes"].reward == 1.0 and judged["yes"].judge["judge_model"] == "judge-model"
    assert judged["undecided"].reward is None  # never silently 0
    assert judged["undecided"].judge["correct"] is None and "no verdict" in judged["undecided"].judge["error"]
    assert len(server.requests) == 1 + 10  # one verdict, then a reply without one asked for 10 times


# ---------------------------------------------------------------- the critic


@pytest.mark.anyio
@pytest.mark.parametrize("rule, expected", [
    (TurnRule(), [(0.75, 1), (None, 0), (None, 0), (0.5, 1)]),
    (TurnRule(failed="penalise", penalty=0.5), [(0.75, 1), (-0.5, 1), (-0.5, 1), (0.5, 1)]),
])
async def test_critic_scores_become_turn_rewards_and_masks(tmp_path: Path, rule: TurnRule,
                                                           expected: list[tuple[float | None, int]]) -> None:
    src = write(tmp_path / "in.jsonl", [make("t1")])
    progress = JudgeProgress()
    with FakeOpenAI(critic_replies) as server:
        result = await judge_file(src, tmp_path / "out.jsonl", config(server, rule), progress=progress)
    [judged] = load_trajectories(tmp_path / "out.jsonl")
    assert [(turn.reward, turn.mask) for turn in judged.turns] == expected
    assert sorted(marker(r) for r in server.requests) == ["THINK-0", "THINK-1", "THINK-3"]  # not the rolled back
    first, second, rolled_back, answer = (turn.critic for turn in judged.turns)
    assert first == {"model": "critic-model", **rating((5, 4, 3)), "passed": True}
    assert second["passed"] is False and second["logical_soundness"]["score"] == 2
    assert rolled_back == {"rolled_back": True}
    assert answer["tool_call_accuracy"] is None and answer["information_gain"] is None  # logical soundness only
    assert answer["logical_soundness"] == {"score": 3, "reason": "logical_soundness is 3"} and answer["passed"]
    assert judged.reward == 1.0 and result["turns_judged"] == 4 and result["critic_failures"] == 0
    assert progress.done == 1 and progress.running == 0 and progress.mean_reward == 1.0
    assert result["masked_turns"] == (2 if rule.failed == "mask" else 0)


@pytest.mark.anyio
async def test_the_critic_reads_the_question_earlier_turns_reasoning_call_and_result(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [make("t1")])
    with FakeOpenAI(critic_replies) as server:
        await judge_file(src, tmp_path / "out.jsonl", config(server))
    prompts = {marker(r): prompt_of(r) for r in server.requests}
    second = prompts["THINK-1"]
    assert QUESTION in second
    assert ('step 1: search_and_scrape_webpage/google_search {"q": "capital of France"} -> '
            'Paris is the capital') in second
    assert "THINK-1: the next thing to look up." in second and "THINK-0" not in second
    assert ('server jina_scrape_llm_summary, tool scrape_and_extract_info, arguments '
            '{"url": "https://example.org/paris", "info_to_extract": "capital"}') in second
    assert "The page confirms: Paris." in second
    answer = prompts["THINK-3"]
    assert "step 2: jina_scrape_llm_summary/scrape_and_extract_info" in answer and "step 3" not in answer
    assert "No tool call (the runtime had asked for the final answer)" in answer and "\\boxed{Paris}" in answer
    assert not any("cannot solve" in p for p in prompts.values())  # the rolled-back reply is shown nowhere
    assert all(r["model"] == "critic-model" and r["temperature"] == 0.0 for r in server.requests)


@pytest.mark.anyio
async def test_malformed_critiques_are_retried_then_the_turn_is_left_unjudged(tmp_path: Path) -> None:
    bad = ["I would rate this turn highly.", json.dumps(rating((7, 3, 3))),
           json.dumps({k: v for k, v in rating((4, 4, 4)).items() if k != "information_gain"})]

    def replies(request: dict[str, Any]) -> str:
        return bad.pop(0) if marker(request) == "THINK-0" else critic_replies(request)

    trajectory = make("t1")
    trajectory.turns[0].mask = 0  # an unjudged turn keeps the mask it came with
    src = write(tmp_path / "in.jsonl", [trajectory])
    with FakeOpenAI(replies) as server:
        result = await judge_file(src, tmp_path / "out.jsonl", config(server))
    [judged] = load_trajectories(tmp_path / "out.jsonl")
    first = judged.turns[0]
    assert sum(marker(r) == "THINK-0" for r in server.requests) == 3  # asked, then retried twice
    assert first.reward is None and first.mask == 0 and first.critic is not None
    assert first.critic["model"] == "critic-model" and "information_gain" in first.critic["error"]
    assert "malformed critique" in first.critic["error"] and "logical_soundness" not in first.critic
    assert judged.turns[1].critic["passed"] is False  # the other turns are judged as usual
    assert result["critic_failures"] == 1


@pytest.mark.anyio
async def test_a_critic_that_times_out_is_retried_then_the_turn_is_left_unjudged(tmp_path: Path) -> None:
    def replies(request: dict[str, Any]) -> Reply | str:
        return Reply(content="{}", delay_s=1.0) if marker(request) == "THINK-0" else critic_replies(request)

    src = write(tmp_path / "in.jsonl", [make("t1")])
    with FakeOpenAI(replies) as server:
        result = await judge_file(src, tmp_path / "out.jsonl", config(server, timeout_s=0.2))
    [judged] = load_trajectories(tmp_path / "out.jsonl")
    assert judged.turns[0].reward is None and "did not answer within 0.2 s" in judged.turns[0].critic["error"]
    assert judged.turns[1].critic["passed"] is False and result["critic_failures"] == 1  # the rest is judged


@pytest.mark.anyio
async def test_a_fenced_reply_with_text_around_it_is_read(tmp_path: Path) -> None:
    def fenced(request: dict[str, Any]) -> str:
        return f"Sure, here is my review.\n```json\n{critic_replies(request)}\n```\nLet me know if you need more."

    src = write(tmp_path / "in.jsonl", [make("t1")])
    with FakeOpenAI(fenced) as server:
        result = await judge_file(src, tmp_path / "out.jsonl", config(server))
    [judged] = load_trajectories(tmp_path / "out.jsonl")
    assert judged.turns[0].reward == 0.75 and result["critic_failures"] == 0 and len(server.requests) == 3


@pytest.mark.anyio
async def test_a_template_file_is_used_verbatim_and_filled_in_one_pass(tmp_path: Path) -> None:
    template = tmp_path / "critic.txt"
    template.write_text("Q={question}\nE={earlier_turns}\nR={reasoning}\nC={tool_calls}\nT={tool_results}\n"
                        'Keep {braces}, {{doubled}}, {"score": 3} and {question_x}.\n', encoding="utf-8")
    question = "Which {reasoning} city?"  # a placeholder inside a value is not filled again
    src = write(tmp_path / "in.jsonl", [make("t1", question=question)])
    with FakeOpenAI(critic_replies) as server:
        await judge_file(src, tmp_path / "out.jsonl", config(server, template=template))
    first = next(prompt_of(r) for r in server.requests if marker(r) == "THINK-0")
    assert first == (
        "Q=Which {reasoning} city?\nE=(none: this is the first step)\nR=THINK-0: the next thing to look up.\n"
        'C=1. server search_and_scrape_webpage, tool google_search, arguments {"q": "capital of France"}\n'
        "T=1.\nParis is the capital and largest city of France.\n"
        'Keep {braces}, {{doubled}}, {"score": 3} and {question_x}.\n')


@pytest.mark.anyio
async def test_no_critic_leaves_turns_as_they_are(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [make("t1")])
    await judge_file(src, tmp_path / "out.jsonl", config(None))
    [judged] = load_trajectories(tmp_path / "out.jsonl")
    assert judged.reward == 1.0
    assert [(t.reward, t.mask, t.critic) for t in judged.turns] == [(None, 1, None)] * 4


# ---------------------------------------------------------------- the out file


@pytest.mark.anyio
async def test_trajectories_are_written_whole_with_token_fields_byte_identical(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [make("t1"), make("t2", answer="Lyon")])
    out = tmp_path / "out.jsonl"
    with FakeOpenAI(critic_replies) as server:
        await judge_file(src, out, config(server))
    before, after = read_records(src), read_records(out)
    key = lambda r: (r.get("id") or r["trajectory_id"], r["type"], r.get("index", -1))  # noqa: E731
    assert sorted(map(key, before)) == sorted(map(key, after))
    by_key = {key(r): r for r in after}
    for record in before:
        judged = by_key[key(record)]
        added = {"turn": {"reward", "mask", "critic"}, "end": {"reward", "judge"}, "start": set()}[record["type"]]
        unchanged = {k: v for k, v in record.items() if k not in added}
        assert {k: v for k, v in judged.items() if k not in added} == unchanged
        for name in TOKEN_FIELDS if record["type"] == "turn" else ():
            assert orjson.dumps(judged[name]) == orjson.dumps(record[name])
    # The very bytes, too: each turn line's token arrays appear in the out file exactly as in the input.
    arrays = re.compile(rb'"(?:prompt_delta_ids|completion_ids|logprobs)":\[[^\]]*\]')
    spans_in = [m.group(0) for line in src.read_bytes().splitlines() for m in arrays.finditer(line)]
    spans_out = [m.group(0) for line in out.read_bytes().splitlines() for m in arrays.finditer(line)]
    assert len(spans_in) == 24 and sorted(spans_in) == sorted(spans_out)


@pytest.mark.anyio
async def test_unfinished_and_cut_short_trajectories_are_skipped(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    write(src, [make("running", stop_reason=None)], finished=False)
    write(src, [make("ok"), make("interrupted", stop_reason="interrupted"), make("crashed", stop_reason="crashed"),
                make("model_error", stop_reason="model_error"), make("max_turns", stop_reason="max_turns")])
    with FakeOpenAI(critic_replies) as server:
        result = await judge_file(src, tmp_path / "out.jsonl", config(server))
    assert sorted(t.id for t in load_trajectories(tmp_path / "out.jsonl")) == ["max_turns", "ok"]  # as finished
    assert result["skipped"] == 4 and result["judged"] == 2 and len(server.requests) == 6


@pytest.mark.anyio
async def test_judging_resumes_past_a_torn_line_without_judging_anything_twice(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [make("a"), make("b"), make("c")])
    out = tmp_path / "out.jsonl"
    with FakeOpenAI(critic_replies) as server:
        await judge_file(write(tmp_path / "only_a.jsonl", [make("a")]), out, config(server))
    assert len(server.requests) == 3
    write(out, [make("b")], finished=False)  # a judge run killed while writing b ...
    with open(out, "ab") as file:
        file.write(b'{"type": "turn", "trajectory_id": "b", "ind')  # ... mid-line
    notices: list[str] = []
    with FakeOpenAI(critic_replies) as server:
        result = await judge_file(src, out, config(server), notices.append)
    assert len(server.requests) == 6 and result["judged"] == 2 and result["already_judged"] == 1
    assert notices == [f"resuming: 1 trajectories already judged in {out}"]
    judged = load_trajectories(out)
    assert sorted(t.id for t in judged) == ["a", "b", "c"]
    assert all(t.reward == 1.0 and len(t.turns) == 4 and t.turns[0].critic for t in judged)
    ends = [r["trajectory_id"] for r in read_records(out) if r["type"] == "end"]
    assert sorted(ends) == ["a", "b", "c"]
    size = out.stat().st_size
    with FakeOpenAI(critic_replies) as server:
        result = await judge_file(src, out, config(server))
    assert server.requests == [] and result["judged"] == 0 and out.stat().st_size == size


# ---------------------------------------------------------------- what the user must fix


@pytest.mark.anyio
async def test_what_the_user_must_fix_is_one_error(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [make("t1")])
    out = tmp_path / "out.jsonl"
    with pytest.raises(JudgeError, match="--no-critic"):
        await judge_file(src, out, JudgeRunConfig())
    with pytest.raises(JudgeError, match="--grader must be"):
        await judge_file(src, out, JudgeRunConfig(grader="nope", no_critic=True))
    with pytest.raises(JudgeError, match="another file"):
        await judge_file(src, src, JudgeRunConfig(no_critic=True))
    with pytest.raises(JudgeError, match="NANBEIGE_JUDGE_API_KEY"):
        await judge_file(src, out, JudgeRunConfig(grader="browsecomp/reference", no_critic=True))
    unreachable = replace(CRITIC_ENDPOINT, base_url=f"http://127.0.0.1:{free_port()}/v1",
                          api_key="sk-critic-secret-key", retries=1, retry_wait_s=0.0)
    with pytest.raises(JudgeError, match="critic unreachable") as raised:
        await judge_file(src, out, JudgeRunConfig(critic=unreachable))
    assert "sk-critic" not in str(raised.value) and "sk-critic" not in repr(unreachable)
    assert not out.exists() or not out.read_bytes()  # nothing half-judged was written
    with FakeOpenAI([Reply(status=401)] * 3) as server:
        refused = replace(CRITIC_ENDPOINT, base_url=server.base_url, api_key="sk-critic-secret-key", retry_wait_s=0.0)
        with pytest.raises(JudgeError, match="HTTP 401"):
            await judge_file(src, out, JudgeRunConfig(critic=refused))
    assert len(server.requests) == 1  # a refused key is not retried


# ---------------------------------------------------------------- a grader that is down, through the CLI


@contextlib.contextmanager
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """A loopback HTTP endpoint that accepts every connection and never answers: a hung server. Yields its
    URL and the connections it took (a call that timed out asks again on a new one)."""
    held: list[socket.socket] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)

        def accept() -> None:
            with contextlib.suppress(OSError):  # the listener closed: the test is over
                while True:
                    held.append(listener.accept()[0])

        threading.Thread(target=accept, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1", held
        finally:
            for connection in held:
                connection.close()


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def assert_one_error_line(result: Any, *words: str) -> str:
    """Exit 1 and one `error:` line holding every word: no traceback, no exception group."""
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "ExceptionGroup" not in result.stderr, result.stderr
    [line] = error_lines(result.stderr)
    assert "crashed" not in line
    for word in words:
        assert word in line, line
    return line


def graded_by_a_judge(tmp_path: Path, count: int = 6) -> Path:
    """Trajectories whose answer only the LLM judge can grade (it is not the gold answer word for word)."""
    return write(tmp_path / "in.jsonl",
                 [make(f"t{n}", answer="Lutetia", grader="equivalent/reference") for n in range(count)])


@pytest.mark.slow
def test_an_unreachable_judge_is_one_error_line_even_when_many_trajectories_fail_at_once(tmp_path: Path) -> None:
    src, out = graded_by_a_judge(tmp_path), tmp_path / "out.jsonl"
    judge_url = f"http://127.0.0.1:{free_port()}/v1"  # refused: nothing listens there
    result = nanbeige("judge", str(src), "--out", str(out), "--no-critic", "--judge-base-url", judge_url)
    assert_one_error_line(result, "outcome judge", "unreachable", judge_url)
    assert not out.exists() or not out.read_bytes()  # nothing judged, nothing written: a resume grades them all


def test_a_hanging_judge_is_one_error_line_within_its_timeout_and_retries(tmp_path: Path) -> None:
    src, out = graded_by_a_judge(tmp_path), tmp_path / "out.jsonl"
    with silent_server() as (judge_url, calls):
        result = nanbeige("judge", str(src), "--out", str(out), "--no-critic", "--judge-base-url", judge_url,
                          "--request-timeout", "1", "--retries", "1", "--concurrency", "4")
        asked = len(calls)
    assert_one_error_line(result, "outcome judge", "did not answer within 1 s", judge_url)
    # bounded by the flags, however slow the machine: each of the 4 calls in flight asked twice at most, and
    # the trajectories not yet started never asked (the command ended, within the helper's time limit)
    assert 1 <= asked <= 4 * 2
    assert not out.exists() or not out.read_bytes()


def test_a_hanging_critic_stops_the_command_instead_of_timing_out_every_turn(tmp_path: Path) -> None:
    src, out = write(tmp_path / "in.jsonl", [make(f"t{n}") for n in range(6)]), tmp_path / "out.jsonl"
    with silent_server() as (critic_url, calls):
        result = nanbeige("judge", str(src), "--out", str(out), "--grader", "gaia-exact", "--critic-base-url",
                          critic_url, "--critic-model", "critic-model", "--request-timeout", "1", "--retries", "0")
        asked = len(calls)
    assert_one_error_line(result, "critic", critic_url, "did not answer", "within 1 s")
    assert asked < 6 * 3  # stopped early, not every turn of the 6 trajectories asked and recorded unjudged
    assert not out.exists() or not out.read_bytes()
