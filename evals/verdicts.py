"""How each source reads its judge's reply: the verdict rules of the benchmarks' own graders and of the
reference harness's evaluator, rule for rule, bugs included (a fixed rule is a separate function, used only
where asked for by name). Each parser returns a `Reading`, or None where its source finds no verdict
(what the source then does, asking again or scoring wrong, is the judge's `no_verdict`).

Sources (the commits read):
- simple-evals `browsecomp_eval.py` (ee3b031): `re.search(r"correct: (yes|no)", reply)`, first match, and
  `match.group(0)` compared with "yes": the whole match "correct: yes" never equals it, so as coded no
  reply is ever correct (open PRs #67 and #93 change it to `group(1)`); no match reads as "no".
- HLE `run_judge_results.py` (87c92ea): structured output validated into `ExtractedAnswer` (every field
  required, `strict` too); `"yes" in correct`.
- BrowseComp-ZH `run.py` (86abe63): one four-label regex (labels in order, each optionally in `**`,
  case-sensitive), `group(3).strip().lower() == "yes"`; anything else is neither right nor wrong, and
  counts as wrong. Its confidence: `int(text.split('%')[0])`, 0 when that fails.
- xbench-evals `eval_grader.py` (17c5621): `re.search(r"结论:*.(正确|错误)")`, first match, then the text
  after the first ASCII colon, stripped (the whole match when there is none); 正确 scores 1, anything else 0.
- MiroThinker `eval_utils.py` (370f983): xBench `re.search(r"结论:*\\s*(正确|错误)")` read the same way, 正确
  or 错误 else no verdict; BrowseComp (both languages) the first capital A or B anywhere; the "equivalent"
  judge the whole reply, stripped, trailing dots dropped, lower-cased, "correct" or "incorrect"; HLE as
  HLE's, with `strict` optional.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ValidationError


@dataclass
class Reading:
    """What a verdict parser read from one judge reply."""

    correct: bool
    """The judge's decision, as the source reads it."""
    extracted: str | None = None
    """The final answer the judge extracted, where the source asks for one."""
    reasoning: str = ""
    """The judge's explanation, where the source asks for one."""
    confidence: int | None = None
    """The response's confidence (0-100) as the source reads it; None where it reads none."""


# ---------------------------------------------------------------- simple-evals BrowseComp


def simple_evals(reply: str) -> Reading:
    """As coded: the first `correct: yes|no`, its whole match compared with "yes" (never equal)."""
    match = re.search(r"correct: (yes|no)", reply)
    grade = match.group(0) if match else "no"
    return Reading(correct=grade == "yes")


def simple_evals_fixed(reply: str) -> Reading:
    """The evident intent (simple-evals PRs #67, #93): the first `correct: yes|no`, its yes/no."""
    match = re.search(r"correct: (yes|no)", reply)
    return Reading(correct=(match.group(1) if match else "no") == "yes")


# ---------------------------------------------------------------- HLE (structured output)


class ExtractedAnswer(BaseModel):
    """HLE's judge reply schema: every field required."""

    extracted_final_answer: str
    reasoning: str
    correct: Literal["yes", "no"]
    confidence: int
    strict: Literal[True]


class HLEExtractedAnswer(BaseModel):
    """The reference harness's copy of it: `strict` has a default."""

    extracted_final_answer: str
    reasoning: str
    correct: Literal["yes", "no"]
    confidence: int
    strict: Literal[True] = True


def _structured(reply: str, schema: type[BaseModel]) -> Reading | None:
    try:
        answer = schema.model_validate_json(reply)
    except ValidationError:
        return None
    return Reading(
        correct="yes" in answer.correct,
        extracted=answer.extracted_final_answer,  # type: ignore
        reasoning=answer.reasoning,
        confidence=answer.confidence,
    )  # type: ignore[attr-defined]


def hle(reply: str) -> Reading | None:
    """HLE's own: the reply validated as `ExtractedAnswer`; None (no verdict) when it does not validate."""
    return _structured(reply, ExtractedAnswer)


def hle_reference(reply: str) -> Reading | None:
    """The reference harness's: validated as `HLEExtractedAnswer`."""
    return _structured(reply, HLEExtractedAnswer)


def response_format(schema: type[BaseModel]) -> dict:
    """The `response_format` the OpenAI SDK's `parse(response_format=schema)` sends: a strict JSON schema
    named after the class, every property required, no others allowed."""
    body = schema.model_json_schema()
    body["required"] = list(body["properties"])
    body["additionalProperties"] = False
    return {"type": "json_schema", "json_schema": {"name": schema.__name__, "schema": body, "strict": True}}


# ---------------------------------------------------------------- BrowseComp-ZH

_ZH_FIELDS = re.compile(
    r"""
    \*{0,2}extracted_final_answer\*{0,2}\s*?:\s*(.*?)\n
    \*{0,2}reasoning\*{0,2}\s*:\s*?(.*?)\n
    \*{0,2}correct\*{0,2}\s*:\s*?(.*?)\n
    \*{0,2}confidence\*{0,2}\s*?:\s*(.*?)$
    """,
    re.DOTALL | re.VERBOSE,
)


def browsecomp_zh(reply: str) -> Reading:
    """BrowseComp-ZH's: the four labels in order; correct when the `correct` field is "yes" in any case.
    Its confidence is read even when the verdict is neither yes nor no (the row is kept), 0 when unreadable."""
    match = _ZH_FIELDS.search(reply)
    if not match:
        return Reading(correct=False, confidence=0)
    extracted, reasoning, verdict, confidence = (group.strip() for group in match.groups())
    return Reading(
        correct=verdict.lower() == "yes", extracted=extracted, reasoning=reasoning, confidence=zh_confidence(confidence)
    )


def zh_confidence(text: str) -> int:
    """BrowseComp-ZH's confidence rule: the integer before the first '%', 0 when that is not one."""
    try:
        return int(text.split("%")[0])
    except ValueError:
        return 0


# ---------------------------------------------------------------- xBench


def _after_colon(match: re.Match[str] | None) -> str | None:
    """xbench's `parse_match_result`: the text after the first ASCII colon of the whole match, stripped;
    the whole match when it has no colon."""
    if match is None:
        return None
    whole = match.group(0)
    parts = whole.split(":")
    return parts[1].strip() if len(parts) > 1 else whole


def xbench(reply: str) -> Reading:
    """xbench-evals': the first `结论`, ASCII colons optional, then exactly one character before 正确/错误."""
    verdict = _after_colon(re.search(r"结论:*.(正确|错误)", reply))
    return Reading(
        correct=verdict == "正确",
        extracted=_after_colon(re.search(r"最终答案:*(.*)", reply)),
        reasoning=_after_colon(re.search(r"解释:*(.*)", reply)) or "",
    )


def xbench_answer(response: str) -> str | None:
    """xbench-evals' shortcut reads the response's first `最终答案` the same way."""
    return _after_colon(re.search(r"最终答案:*(.*)", response))


def xbench_reference(reply: str) -> Reading | None:
    """The reference harness's: the first `结论`, ASCII colons optional, any whitespace; 正确 or 错误 after
    the colon, else no verdict."""
    verdict = _after_colon(re.search(r"结论:*\s*(正确|错误)", reply))
    if verdict not in ("正确", "错误"):
        return None
    return Reading(correct=verdict == "正确")


# ---------------------------------------------------------------- the reference harness's other judges


def choice_ab(reply: str) -> Reading | None:
    """The reference harness's BrowseComp judges: the first capital A or B anywhere (A: correct)."""
    match = re.search(r"[AB]", reply)
    return Reading(correct=match.group(0) == "A") if match else None


def equivalent(reply: str) -> Reading | None:
    """The reference harness's "equivalent" judge (GAIA, SEAL-0): the whole reply, stripped, trailing dots
    dropped, any case: "correct" or "incorrect"."""
    word = reply.strip().rstrip(".").lower()
    return Reading(correct=word == "correct") if word in ("correct", "incorrect") else None
