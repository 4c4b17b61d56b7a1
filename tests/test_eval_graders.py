"""The graders of `nanbeige eval`: GAIA's exact match, and LLM judges asked over real loopback HTTP.

The judge tests script a fake OpenAI-compatible server's replies and read back the requests it got.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import httpx
import pytest
from conftest import free_port
from fake_openai import FakeOpenAI, Reply

from nanbeige.evals.gaia_scorer import grade_exact, question_scorer
from nanbeige.evals.judges import PROFILES, JudgeConfig, JudgeUnavailable, judge, parse_labelled, profile_for
from nanbeige.evals.tasks import Verdict

QUESTION = "Which city hosted the 1900 Summer Olympics?"
RESPONSE = "I searched the archives. The games were held in Paris.\n\n\\boxed{Paris}"
GOLD = "Paris"
WELL_FORMED = "extracted_final_answer: Paris\nreasoning: Both name Paris.\ncorrect: yes\nconfidence: 90%"


@pytest.mark.parametrize(("answer", "gold", "expected"), [
    ("$1,000", "1000", True),
    ("1000.0", "1000", True),
    ("12%", "12", True),
    ("3.0", "3", True),
    (" 42 ", "42", True),
    ("4 2", "42", False),
    ("twelve", "12", False),
    ("Sea Gull", "seagull", True),
    ("Paris.", "paris", True),
    ("a; b ; c", "a, b, c", True),
    ("b, a", "a, b", False),
    ("1, 2", "1,2,3", False),
    ("1.50, x", "1.5, X", True),
    ("1,000", "1,000", True),
    ("1000", "1,000", False),
    (None, "None", True),
    ("St. Louis", "Saint Louis", False),
    ("The Beatles", "Beatles", False),
    ("apple.", "apple, banana", False),
])
def test_gaia_scorer_matches_the_official_cases(answer: str | None, gold: str, expected: bool) -> None:
    assert question_scorer(answer, gold) is expected


def test_gaia_list_elements_keep_their_punctuation() -> None:
    assert question_scorer("St. Louis", "St Louis")
    assert not question_scorer("St. Louis, Paris", "St Louis, Paris")


def test_grade_exact_records_the_grader_and_the_compared_answer() -> None:
    right, wrong = grade_exact("1,000", "1000"), grade_exact("999", "1000")
    assert (right.correct, right.grader, right.extracted, right.judge_model) == (True, "gaia-exact", "1,000", None)
    assert wrong.correct is False and wrong.reason


def config(server: FakeOpenAI, **changes: object) -> JudgeConfig:
    values: dict = dict(base_url=server.base_url, model="judge-model", api_key="sk-secret", retries=2,
                        retry_wait_s=0.0, temperature=0.0, max_tokens=512)
    return JudgeConfig(**(values | changes))


@pytest.fixture(scope="module")
def judge_server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI([]) as server:  # one server for the module: each one takes half a second to shut down
        yield server


@pytest.fixture
def server(judge_server: FakeOpenAI) -> FakeOpenAI:
    """The loopback judge with nothing scripted yet and no requests recorded; unscripted requests get a
    reply with no verdict in it."""
    judge_server.replies, judge_server.default = [], "no verdict here"
    judge_server.requests.clear()
    return judge_server


async def ask(server: FakeOpenAI, profile: str, replies: list, response: str = RESPONSE, gold: str = GOLD,
              **changes: object) -> tuple[Verdict, list[dict]]:
    """The verdict of `profile` from the server scripted with `replies`, and the requests it got."""
    server.replies = list(replies)
    async with httpx.AsyncClient() as client:
        verdict = await judge(PROFILES[profile], QUESTION, response, gold, config(server, **changes), client)
    return verdict, server.requests


@pytest.mark.anyio
@pytest.mark.parametrize(("profile", "system"), [("browsecomp", "You are a helpful assistant."), ("hle", None),
                                                 ("browsecomp-zh", "you are a helpful assistant!")])
async def test_labelled_judges_send_the_inputs_and_read_the_verdict(server: FakeOpenAI, profile: str,
                                                                    system: str | None) -> None:
    verdict, requests = await ask(server, profile, [WELL_FORMED])
    assert (verdict.correct, verdict.grader, verdict.judge_model) == (True, profile, "judge-model")
    assert (verdict.extracted, verdict.reason, verdict.error) == ("Paris", "Both name Paris.", None)
    [request] = requests
    assert [m["role"] for m in request["messages"]] == (["system", "user"] if system else ["user"])
    assert system is None or request["messages"][0]["content"] == system
    prompt = request["messages"][-1]["content"]
    assert QUESTION in prompt and RESPONSE in prompt and "[correct_answer]: Paris" in prompt
    assert "{question}" not in prompt and "{response}" not in prompt and "{correct_answer}" not in prompt
    assert (request["model"], request["temperature"], request["max_tokens"]) == ("judge-model", 0.0, 512)
    assert request["_headers"]["Authorization"] == "Bearer sk-secret"


@pytest.mark.anyio
@pytest.mark.parametrize(("reply", "correct"), [
    ("extracted_final_answer: Paris\nreasoning: same\ncorrect: no\nconfidence: 100", False),
    ("**extracted_final_answer:** Paris\n**reasoning:** same\n**correct:** yes\n**confidence:** 80%", True),
    ("**correct**: yes", True),
    ("correct: **no**", False),
    ("CORRECT: Yes", True),
    # simple-evals compares the whole match "correct: yes" with "yes": it must be the captured word.
    ("reasoning: fine\ncorrect: yes", True),
    # A line starting with "incorrect:" is not the verdict, nor is "correct:" in the middle of a line.
    ("reasoning: one might say\nincorrect: yes\nor even correct: yes\ncorrect: no", False),
    # A judge that changes its mind: the last verdict line counts.
    ("correct: no\nOn reflection the units agree.\ncorrect: yes", True),
])
async def test_the_last_line_starting_with_correct_decides(server: FakeOpenAI, reply: str, correct: bool) -> None:
    verdict, requests = await ask(server, "browsecomp", [reply])
    assert verdict.correct is correct and len(requests) == 1


def test_confidence_is_read_as_an_integer_or_left_out() -> None:
    assert parse_labelled(WELL_FORMED).confidence == 90
    assert parse_labelled("correct: yes\nconfidence: 85").confidence == 85
    assert parse_labelled("correct: yes\nconfidence: 72.6%").confidence == 73
    assert parse_labelled("correct: yes\nconfidence: high").confidence is None
    assert parse_labelled("correct: yes").confidence is None


@pytest.mark.anyio
async def test_a_reply_without_a_verdict_is_asked_again(server: FakeOpenAI) -> None:
    verdict, requests = await ask(server, "browsecomp", ["extracted_final_answer: Paris\nreasoning: same", WELL_FORMED])
    assert verdict.correct is True and len(requests) == 2
    assert requests[0]["messages"] == requests[1]["messages"]


@pytest.mark.anyio
@pytest.mark.parametrize("profile", ["browsecomp", "hle", "browsecomp-zh", "xbench", "equivalent"])
async def test_a_judge_that_never_gives_a_verdict_fails_without_raising(server: FakeOpenAI, profile: str) -> None:
    verdict, requests = await ask(server, profile, [], response="something else", retries=2)
    assert verdict.correct is None and verdict.error.startswith("malformed verdict")
    assert (verdict.grader, verdict.judge_model) == (profile, "judge-model")
    assert len(requests) == 3


@pytest.mark.anyio
@pytest.mark.parametrize("status", [500, 503, 429])
async def test_server_errors_are_retried(server: FakeOpenAI, status: int) -> None:
    verdict, requests = await ask(server, "hle", [Reply(status=status), WELL_FORMED])
    assert verdict.correct is True and len(requests) == 2


@pytest.mark.anyio
async def test_a_refused_request_is_not_retried_and_the_key_is_not_reported(server: FakeOpenAI) -> None:
    # a refused key says nothing about the answer: the judge is unavailable, not the answer wrong
    with pytest.raises(JudgeUnavailable, match="HTTP 401") as failed:
        await ask(server, "hle", [Reply(status=401, body={"error": "bad key"}), WELL_FORMED])
    assert len(server.requests) == 1
    assert "sk-secret" not in str(failed.value) and "sk-secret" not in repr(JudgeConfig(api_key="sk-secret"))


@pytest.mark.anyio
async def test_an_unreachable_judge_is_unavailable_not_a_verdict() -> None:
    cfg = JudgeConfig(base_url=f"http://127.0.0.1:{free_port()}/v1", retries=1, retry_wait_s=0.0)
    async with httpx.AsyncClient() as client:
        with pytest.raises(JudgeUnavailable, match="unreachable"):
            await judge(PROFILES["browsecomp"], QUESTION, RESPONSE, GOLD, cfg, client)


@pytest.mark.anyio
@pytest.mark.parametrize(("reply", "correct"), [
    ("最终答案: 巴黎\n解释: 与正确答案一致。\n结论: 正确", True),
    ("最终答案：巴黎\n解释：一致。\n结论：正确", True),  # full-width colons
    ("最终答案: 伦敦\n解释: 不一致。\n结论:错误", False),
    ("**最终答案**: 巴黎\n**解释**: 一致。\n**结论**:  正确", True),
])
async def test_xbench_reads_the_conclusion_with_either_colon(server: FakeOpenAI, reply: str, correct: bool) -> None:
    verdict, requests = await ask(server, "xbench", [reply], gold="巴黎")
    assert verdict.correct is correct and verdict.grader == "xbench"
    assert verdict.extracted in ("巴黎", "伦敦") and verdict.reason
    prompt = requests[0]["messages"][0]["content"]
    assert QUESTION in prompt and RESPONSE in prompt and "[正确答案]: 巴黎" in prompt


@pytest.mark.anyio
async def test_xbench_skips_the_judge_when_the_final_answer_is_the_gold(server: FakeOpenAI) -> None:
    verdict, requests = await ask(server, "xbench", [], response="查到了。\n最终答案: 巴黎", gold="巴黎")
    assert (verdict.correct, verdict.extracted, verdict.judge_model, requests) == (True, "巴黎", None, [])


@pytest.mark.anyio
@pytest.mark.parametrize(("reply", "correct"), [
    ("Correct", True), ("Correct.", True), (" incorrect.\n", False), ("INCORRECT", False),
    ("<think>Is Paris, France the same as Paris? Yes.</think>\n\nCorrect", True),  # a thinking judge's deliberation
])
async def test_equivalent_reads_a_single_word(server: FakeOpenAI, reply: str, correct: bool) -> None:
    verdict, requests = await ask(server, "equivalent", [reply], response="Paris, France")
    assert verdict.correct is correct
    prompt = requests[0]["messages"][0]["content"]
    assert "Labeled answer: Paris" in prompt and "Predicted answer: Paris, France" in prompt and QUESTION in prompt


@pytest.mark.anyio
async def test_equivalent_asks_again_after_more_than_one_word(server: FakeOpenAI) -> None:
    verdict, requests = await ask(server, "equivalent", ["Correct, they match.", "Incorrect"], response="Lyon")
    assert verdict.correct is False and len(requests) == 2


@pytest.mark.anyio
async def test_equivalent_skips_the_judge_when_the_prediction_is_the_gold(server: FakeOpenAI) -> None:
    verdict, requests = await ask(server, "equivalent", [], response="Paris")
    assert (verdict.correct, verdict.extracted, requests) == (True, "Paris", [])


@pytest.mark.anyio
async def test_a_template_file_replaces_the_prompt_verbatim(server: FakeOpenAI, tmp_path: Path) -> None:
    template = tmp_path / "official.txt"
    template.write_text("Q: {question}\nR: {response}\nA: {correct_answer}\nKeep {this}, {{that}}, {0} and 0|\\%|.\n",
                        encoding="utf-8")
    question = "What does {response} mean here?"
    server.replies = [WELL_FORMED]
    async with httpx.AsyncClient() as client:
        verdict = await judge(profile_for("browsecomp", template), question, "It means {x}.", GOLD, config(server),
                              client)
    [request] = server.requests
    assert verdict.correct is True
    assert request["messages"][0]["content"] == "You are a helpful assistant."
    assert request["messages"][1]["content"] == (
        "Q: What does {response} mean here?\nR: It means {x}.\nA: Paris\nKeep {this}, {{that}}, {0} and 0|\\%|.\n")
    assert profile_for("browsecomp").template == PROFILES["browsecomp"].template != profile_for("browsecomp", template)
