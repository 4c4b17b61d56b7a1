"""The graders of `nanbeige eval`: GAIA's exact match, and the LLM judges of both families asked over real
loopback HTTP. Each verdict parser is held to its source's rule on replies where the sources disagree with
each other (every expected value below is what the source's own code returns for that reply); the requests
are read back from a fake OpenAI-compatible server.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from conftest import free_port
from fake_openai import FakeOpenAI, Reply

from nanbeige.evals import verdicts
from nanbeige.evals.gaia_scorer import grade_exact, question_scorer
from nanbeige.evals.judges import JUDGE_ENDPOINT, PROFILES, JudgeUnavailable, grader_name, judge, profile_for
from nanbeige.evals.tasks import Verdict
from nanbeige.tools.endpoint import ChatEndpoint

QUESTION = "Which city hosted the 1900 Summer Olympics?"
RESPONSE = "I searched the archives. The games were held in Paris.\n\n\\boxed{Paris}"
GOLD = "Paris"
WELL_FORMED = "extracted_final_answer: Paris\nreasoning: Both name Paris.\ncorrect: yes\nconfidence: 90%"


@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [
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
    ],
)
def test_gaia_scorer_matches_the_official_cases(answer: str | None, gold: str, expected: bool) -> None:
    assert question_scorer(answer, gold) is expected


def test_gaia_list_elements_keep_their_punctuation() -> None:
    assert question_scorer("St. Louis", "St Louis")
    assert not question_scorer("St. Louis, Paris", "St Louis, Paris")


def test_grade_exact_records_the_grader_and_the_compared_answer() -> None:
    right, wrong = grade_exact("1,000", "1000"), grade_exact("999", "1000")
    assert (right.correct, right.grader, right.extracted, right.judge_model) == (True, "gaia-exact", "1,000", None)
    assert wrong.correct is False and wrong.reason


def config(server: FakeOpenAI, **changes: object) -> ChatEndpoint:
    values: dict = dict(base_url=server.base_url, api_key="sk-secret", retries=2, retry_wait_s=0.0)
    return replace(JUDGE_ENDPOINT, **(values | changes))


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


async def ask(
    server: FakeOpenAI, profile: str, replies: list, shown: str = RESPONSE, gold: str = GOLD, **changes: object
) -> tuple[Verdict, list[dict]]:
    """The verdict of `profile` (its waits between attempts cut to 0) from the server scripted with
    `replies`, and the requests it got."""
    server.replies = list(replies)
    async with httpx.AsyncClient() as client:
        verdict = await judge(
            replace(PROFILES[profile], wait_s=0.0), QUESTION, shown, gold, config(server, **changes), client
        )
    return verdict, server.requests


# ---------------------------------------------------------------- verdict rules, reply by reply

LABELS = "extracted_final_answer: Paris\nreasoning: matches\n"
# (reply, simple-evals as coded, simple-evals with group(1), BrowseComp-ZH (verdict, confidence))
LABELLED = [
    (LABELS + "correct: yes\nconfidence: 90%", False, True, (True, 90)),
    ("extracted_final_answer: Paris\n\nreasoning: matches\n\ncorrect: yes\n\nconfidence: 90", False, True, (True, 90)),
    (LABELS + "**correct:** yes\nconfidence: 90%", False, False, (False, 90)),
    (
        "**extracted_final_answer**: Paris\n**reasoning**: matches\n**correct**: yes\n**confidence**: 90%",
        False,
        False,
        (True, 90),
    ),
    (LABELS + "Correct: Yes\nconfidence: 90%", False, False, (False, 0)),
    (LABELS + "correct: Yes\nconfidence: 90%", False, False, (True, 90)),
    (
        "extracted_final_answer: Lyon\nreasoning: one might say correct: yes but it is incorrect: yes\ncorrect: no\n"
        "confidence: 80%",
        False,
        True,
        (False, 80),
    ),
    (LABELS + "correct: yes\nconfidence: 90%\ncorrect: no", False, True, (True, 90)),
    (LABELS + "correct: no\ncorrect: yes\nconfidence: 90%", False, False, (False, 90)),
    (LABELS + "correct: yes.\nconfidence: about 0.9", False, True, (False, 0)),
    (LABELS + "correct: yes\nconfidence: N/A", False, True, (True, 0)),
    ("correct:yes", False, False, (False, 0)),
]


@pytest.mark.parametrize(("reply", "as_coded", "fixed", "zh"), LABELLED)
def test_the_labelled_verdicts_follow_simple_evals_and_browsecomp_zh(
    reply: str, as_coded: bool, fixed: bool, zh: tuple[bool, int]
) -> None:
    assert verdicts.simple_evals(reply).correct is as_coded  # group(0) is never "yes"
    assert verdicts.simple_evals_fixed(reply).correct is fixed  # first match, case-sensitive, one space
    reading = verdicts.browsecomp_zh(reply)
    assert (reading.correct, reading.confidence) == zh


# (reply, xbench-evals' score, the reference harness's xBench verdict: True, False or None for no verdict)
CONCLUSIONS = [
    ("最终答案: 巴黎\n解释: 一致\n结论: 正确", True, True),
    ("最终答案：巴黎\n解释：一致\n结论：正确", False, None),  # full-width colons
    ("结论:正确", True, True),
    ("结论:  正确", False, True),  # two spaces: xbench wants exactly one character
    ("结论: 错误\n结论: 正确", False, False),  # the first conclusion counts
    ("**结论**: 正确", False, None),
    ("结论: **正确**", False, None),
    ("结论：错误", False, None),
    ("结论 正确", False, None),  # no colon: the whole match is not 正确
]


@pytest.mark.parametrize(("reply", "official", "reference"), CONCLUSIONS)
def test_the_xbench_verdicts_follow_xbench_evals_and_the_reference_harness(
    reply: str, official: bool, reference: bool | None
) -> None:
    assert verdicts.xbench(reply).correct is official
    reading = verdicts.xbench_reference(reply)
    assert (reading.correct if reading else None) is reference


@pytest.mark.parametrize(
    ("reply", "ab", "equivalent"),
    [
        ("A", True, None),
        ("B", False, None),
        ("Answer: B", True, None),  # the A of "Answer" comes first
        ("[CORRECT]", None, None),
        ("b", None, None),
        ("N/A", True, None),
        ("Correct.", None, True),
        ("Correct..", None, True),
        (" incorrect\n", None, False),
        ("**Correct**", None, None),
        ("Correct, they match.", None, None),
        ("INCORRECT", None, False),
    ],
)
def test_the_reference_harness_choice_and_equivalent_verdicts(
    reply: str, ab: bool | None, equivalent: bool | None
) -> None:
    reading = verdicts.choice_ab(reply)
    assert (reading.correct if reading else None) is ab
    reading = verdicts.equivalent(reply)
    assert (reading.correct if reading else None) is equivalent


HLE_BODY = {"extracted_final_answer": "Paris", "reasoning": "same", "correct": "yes", "confidence": 90, "strict": True}


@pytest.mark.parametrize(
    ("changes", "official", "reference"),
    [
        ({}, True, True),
        ({"correct": "Yes"}, None, None),  # a Literal takes only its exact values
        ({"confidence": "85"}, True, True),  # lax: a numeric string is an int
        ({"confidence": "85%"}, None, None),
        ({"confidence": 90.5}, None, None),
        ({"strict": None}, None, True),  # left out: HLE's schema requires it, the reference harness's has a default
        ({"correct": "no"}, False, False),
    ],
)
def test_the_hle_structured_verdicts(changes: dict, official: bool | None, reference: bool | None) -> None:
    import json

    body = {k: v for k, v in (HLE_BODY | changes).items() if v is not None}
    for parse, expected in ((verdicts.hle, official), (verdicts.hle_reference, reference)):
        reading = parse(json.dumps(body))
        assert (reading.correct if reading else None) is expected
    assert verdicts.hle("correct: yes") is None  # not JSON at all


# ---------------------------------------------------------------- what each judge sends


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("name", "model", "fields", "system"),
    [
        (
            "browsecomp/official",
            "gpt-4.1-2025-04-14",
            {"temperature": 0.5, "max_tokens": 2048},
            "You are a helpful assistant.",
        ),
        ("browsecomp/reference", "gpt-4.1-2025-04-14", {"max_completion_tokens": 2}, None),
        ("browsecomp-zh/official", "gpt-4o", {"temperature": 0.6, "top_p": 0.95}, "you are a helpful assistant!"),
        (
            "hle/official",
            "o3-mini-2025-01-31",
            {"max_completion_tokens": 4096, "response_format": "ExtractedAnswer"},
            None,
        ),
        (
            "hle/reference",
            "o3-mini-2025-01-31",
            {"max_completion_tokens": 4096, "response_format": "HLEExtractedAnswer"},
            None,
        ),
        ("xbench/official", "gemini-2.0-flash", {}, None),
        ("xbench/reference", "gpt-4.1-2025-04-14", {}, None),
        ("equivalent/reference", "gpt-4.1-2025-04-14", {}, None),
    ],
)
async def test_each_judge_sends_its_sources_model_and_sampling_fields_and_nothing_else(
    server: FakeOpenAI, name: str, model: str, fields: dict, system: str | None
) -> None:
    verdict, requests = await ask(server, name, ["whatever"], shown="Lyon")
    request = requests[0]  # the reference harness asks again while a reply holds no verdict: the same request
    sent = {k: v for k, v in request.items() if not k.startswith("_") and k not in ("model", "messages")}
    if "response_format" in sent:  # o-series, structured output: a strict schema named after the source's class
        schema = sent["response_format"]["json_schema"]
        assert schema["strict"] is True and set(schema["schema"]["required"]) == set(HLE_BODY)
        sent["response_format"] = schema["name"]
    assert (request["model"], sent) == (model, fields)
    assert "temperature" not in sent or not name.startswith("hle")
    assert [m["role"] for m in request["messages"]] == (["system", "user"] if system else ["user"])
    assert system is None or request["messages"][0]["content"] == system
    prompt = request["messages"][-1]["content"]
    assert QUESTION in prompt and "Lyon" in prompt and GOLD in prompt and "{response}" not in prompt
    assert request["_headers"]["Authorization"] == "Bearer sk-secret"
    assert verdict.grader == name and verdict.judge_model == model


@pytest.mark.anyio
async def test_a_judge_model_given_replaces_the_sources_and_is_recorded(server: FakeOpenAI) -> None:
    verdict, [request] = await ask(server, "equivalent/reference", ["Correct"], shown="Lyon", model="local-judge")
    assert request["model"] == verdict.judge_model == "local-judge" and verdict.correct is True


# ---------------------------------------------------------------- attempts, shortcuts, failures


@pytest.mark.anyio
async def test_the_reference_harness_asks_ten_times_for_a_verdict_then_counts_it_wrong(server: FakeOpenAI) -> None:
    verdict, requests = await ask(server, "browsecomp/reference", [], shown="Lyon")
    assert len(requests) == 10 and verdict.correct is None and "no verdict" in verdict.error
    assert PROFILES["browsecomp/reference"].wait_s == 5.0  # its wait between them
    server.requests.clear()
    verdict, requests = await ask(server, "equivalent/reference", ["Correct, they match.", "Incorrect"], shown="Lyon")
    assert verdict.correct is False and len(requests) == 2


@pytest.mark.anyio
async def test_hles_own_judge_counts_a_reply_it_cannot_validate_as_unjudged_without_asking_again(
    server: FakeOpenAI,
) -> None:
    verdict, requests = await ask(server, "hle/official", ["correct: yes"])
    assert len(requests) == 1 and verdict.correct is None


@pytest.mark.anyio
async def test_simple_evals_never_counts_a_yes_unless_the_fixed_rule_is_asked_for(server: FakeOpenAI) -> None:
    well_formed = LABELS + "correct: yes\nconfidence: 90%"
    as_coded, _ = await ask(server, "browsecomp/official", [well_formed])
    fixed, _ = await ask(server, "browsecomp/official-fixed", [well_formed])
    assert (as_coded.correct, fixed.correct) == (False, True)


@pytest.mark.anyio
async def test_xbench_official_skips_the_judge_when_the_responses_first_final_answer_is_the_gold(
    server: FakeOpenAI,
) -> None:
    verdict, requests = await ask(
        server, "xbench/official", [], shown="查到了。\n最终答案: 巴黎\n最终答案: 伦敦", gold="巴黎"
    )
    assert (verdict.correct, verdict.extracted, verdict.judge_model, requests) == (True, "巴黎", None, [])
    verdict, requests = await ask(server, "xbench/official", ["结论: 正确"], shown="最终答案: 12:30", gold="12:30")
    assert len(requests) == 1  # the text after the colon is cut at the next colon: "12" is not "12:30"


@pytest.mark.anyio
async def test_the_reference_harness_skips_the_judge_only_for_an_identical_string(server: FakeOpenAI) -> None:
    verdict, requests = await ask(server, "equivalent/reference", [], shown="Paris")
    assert (verdict.correct, requests) == (True, [])
    verdict, requests = await ask(server, "equivalent/reference", ["Correct"], shown="Paris ")
    assert len(requests) == 1  # no stripping


@pytest.mark.anyio
@pytest.mark.parametrize("status", [500, 503, 429])
async def test_server_errors_are_retried(server: FakeOpenAI, status: int) -> None:
    verdict, requests = await ask(server, "equivalent/reference", [Reply(status=status), "Correct"], shown="Lyon")
    assert verdict.correct is True and len(requests) == 2


@pytest.mark.anyio
async def test_a_refused_request_is_not_retried_and_the_key_is_not_reported(server: FakeOpenAI) -> None:
    # a refused key says nothing about the answer: the judge is unavailable, not the answer wrong
    with pytest.raises(JudgeUnavailable, match="HTTP 401") as failed:
        await ask(server, "hle/official", [Reply(status=401, body={"error": "bad key"}), "Correct"])
    assert len(server.requests) == 1
    assert "sk-secret" not in str(failed.value)
    assert "sk-secret" not in repr(replace(JUDGE_ENDPOINT, api_key="sk-secret"))


@pytest.mark.anyio
async def test_an_unreachable_judge_is_unavailable_not_a_verdict() -> None:
    cfg = replace(JUDGE_ENDPOINT, base_url=f"http://127.0.0.1:{free_port()}/v1", retries=1, retry_wait_s=0.0)
    async with httpx.AsyncClient() as client:
        with pytest.raises(JudgeUnavailable, match="unreachable"):
            await judge(PROFILES["browsecomp/official"], QUESTION, RESPONSE, GOLD, cfg, client)


def test_families_name_each_benchmarks_grader() -> None:
    assert grader_name("browsecomp", "reference") == "browsecomp/reference"
    assert grader_name("hle-500", "official") == "hle/official"
    assert grader_name("xbench-2510", "official-fixed") == "xbench/official"  # nothing to fix there
    assert grader_name("gaia", "official") == "gaia-exact"
    assert grader_name("gaia", "reference") == "equivalent/reference"
    with pytest.raises(ValueError, match="SEAL-0's authors publish no grader"):
        grader_name("seal-0", "official")


@pytest.mark.anyio
async def test_a_template_file_replaces_the_prompt_verbatim(server: FakeOpenAI, tmp_path: Path) -> None:
    template = tmp_path / "official.txt"
    template.write_text(
        "Q: {question}\nR: {response}\nA: {correct_answer}\nKeep {this}, {{that}}, {0} and 0|\\%|.\n", encoding="utf-8"
    )
    question = "What does {response} mean here?"
    server.replies = [LABELS + "correct: yes\nconfidence: 90%"]
    async with httpx.AsyncClient() as client:
        verdict = await judge(
            profile_for("browsecomp/official-fixed", template), question, "It means {x}.", GOLD, config(server), client
        )
    [request] = server.requests
    assert verdict.correct is True
    assert request["messages"][0]["content"] == "You are a helpful assistant."
    assert request["messages"][1]["content"] == (
        "Q: What does {response} mean here?\nR: It means {x}.\nA: Paris\nKeep {this}, {{that}}, {0} and 0|\\%|.\n"
    )
    assert profile_for("browsecomp/official").template == PROFILES["browsecomp/official"].template
