"""LLM judges: one named profile per official judge, asked over an OpenAI-compatible chat API.

A profile keeps the official judge's inputs, reply fields and verdict rule, with a prompt in our own
words. To reproduce published numbers with the official prompt text, pass it as a template file
(`--judge-template FILE`, `JudgeConfig.template`, applied by `profile_for`): the file is used verbatim,
and only the placeholders below are filled, so any other braces in it stay as they are.

Every profile fills the same three placeholders:

- `{question}`: the question as the agent saw it;
- `{response}`: the agent's whole response for `browsecomp`, `hle`, `browsecomp-zh` and `xbench`; the
  predicted short answer (the boxed answer) for `equivalent`;
- `{correct_answer}`: the gold answer (the "labeled answer" of `equivalent`).

The verdict parsers avoid known upstream bugs: the `correct:` line is read by its captured yes/no (not
the whole match), only at the start of a line, and the last one wins, so `incorrect: yes` in the
reasoning does not count; xBench's `结论` takes an ASCII or full-width colon and any spacing.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import httpx

from nanbeige.evals.endpoint import CallFailed, chat_text
from nanbeige.evals.tasks import Verdict



class MalformedVerdict(ValueError):
    """The judge's reply holds no verdict in the profile's format."""


@dataclass
class Reading:
    """What a verdict parser read from one judge reply."""

    correct: bool
    """The judge's decision."""
    extracted: str | None = None
    """The final answer the judge extracted from the response, where the profile asks for one."""
    reasoning: str = ""
    """The judge's explanation, where the profile asks for one."""
    confidence: int | None = None
    """The response's confidence (0-100) as the judge copied it; None when absent or unreadable."""


@dataclass(frozen=True)
class Profile:
    """One official judge: its inputs, prompt, reply fields and verdict rule."""

    name: str
    """The name results record as their grader (`browsecomp`, `hle`, ...)."""
    template: str
    """The user message, with `{question}`, `{response}` and `{correct_answer}` to fill."""
    system: str | None
    """The system message the official judge sends, if any."""
    fields: tuple[str, ...]
    """The labelled fields (or the single word) the judge is asked to reply with."""
    parse: Callable[[str], Reading]
    """The verdict rule: reads a reply, raises `MalformedVerdict` when it holds no verdict."""
    shortcut: Callable[[str, str], str | None] | None = None
    """Given (response, gold), the matching answer when it equals gold, so the judge need not be asked."""
    reads_answer: bool = False
    """What `{response}` is: the agent's short (boxed) answer when True, as the reference harness gives
    its "equivalent" judge; else the agent's whole final response, which the judge extracts from."""


@dataclass
class JudgeConfig:
    """How to reach the judge model and how to ask it."""

    base_url: str = "https://api.openai.com/v1"
    """OpenAI-compatible endpoint, up to and including `/v1`."""
    model: str = "gpt-4.1-2025-04-14"
    """Judge model name; recorded in every verdict."""
    api_key: str | None = field(default=None, repr=False)
    """Bearer token, if the server wants one. Never printed or logged."""
    temperature: float = 0.0
    """Sampling temperature for the judge; 0 for repeatable grades (simple-evals' grader samples at 0.5)."""
    max_tokens: int = 2048
    """Most tokens one judge reply may have."""
    timeout_s: float = 120.0
    """Timeout for one judge call."""
    retries: int = 3
    """How many times to ask again after a transport error, a 408/429/5xx answer or a malformed verdict."""
    retry_wait_s: float = 1.0
    """Wait before the first retry; doubled for each later one."""
    template: Path | None = None
    """A file whose text replaces the profile's prompt verbatim (`--judge-template`), e.g. the official text;
    `profile_for` applies it, once, when the run starts."""


def _label(name: str) -> str:
    """A label at the start of a line, in plain or markdown bold form (`name:`, `**name:**`, `**name**:`)."""
    return rf"^[ \t]*(?:\*\*)?{name}(?:\*\*)?[ \t]*[:：][ \t]*(?:\*\*)?[ \t]*"


_CORRECT = re.compile(_label("correct") + r"[\"'“”]?(yes|no)\b", re.IGNORECASE | re.MULTILINE)
_EXTRACTED = re.compile(_label("extracted_final_answer") + r"(.*)$", re.IGNORECASE | re.MULTILINE)
_REASONING = re.compile(_label("reasoning") + r"(.*?)(?=" + _label("(?:correct|confidence)") + r"|\Z)",
                        re.IGNORECASE | re.MULTILINE | re.DOTALL)
_CONFIDENCE = re.compile(_label("confidence") + r"(\d+(?:\.\d+)?)", re.IGNORECASE | re.MULTILINE)
_CONCLUSION = re.compile(_label("结论") + r"(正确|错误)", re.MULTILINE)
_FINAL_ANSWER = re.compile(_label("最终答案") + r"(.*)$", re.MULTILINE)
_EXPLANATION = re.compile(_label("解释") + r"(.*)$", re.MULTILINE)


def _last(pattern: re.Pattern[str], text: str) -> str | None:
    matches = pattern.findall(text)
    return matches[-1].strip().strip("*").strip() if matches else None


def _confidence(text: str) -> int | None:
    value = _last(_CONFIDENCE, text)
    return round(float(value)) if value is not None else None


def parse_labelled(text: str) -> Reading:
    """The English-labelled reply of the BrowseComp, HLE and BrowseComp-ZH judges: the last line
    starting with `correct:` decides, by its yes/no."""
    decision = _last(_CORRECT, text)
    if decision is None:
        raise MalformedVerdict("no line starting with 'correct: yes|no'")
    return Reading(correct=decision.lower() == "yes", extracted=_last(_EXTRACTED, text),
                   reasoning=_last(_REASONING, text) or "", confidence=_confidence(text))


def parse_xbench(text: str) -> Reading:
    """The xBench judge's Chinese-labelled reply: the last `结论:` line decides, 正确 (right) or 错误 (wrong)."""
    decision = _last(_CONCLUSION, text)
    if decision is None:
        raise MalformedVerdict("no line starting with '结论: 正确|错误'")
    return Reading(correct=decision == "正确", extracted=_last(_FINAL_ANSWER, text),
                   reasoning=_last(_EXPLANATION, text) or "")


def parse_equivalent(text: str) -> Reading:
    """The single-word reply of the "equivalent" judge: Correct or Incorrect, any case, one trailing period."""
    word = text.strip().rstrip(".").lower()
    if word not in ("correct", "incorrect"):
        raise MalformedVerdict(f"expected the single word Correct or Incorrect, got {text[:80]!r}")
    return Reading(correct=word == "correct")


def xbench_shortcut(response: str, gold: str) -> str | None:
    """The response's `最终答案:` when it is exactly the gold answer (xBench then skips the judge)."""
    answer = _last(_FINAL_ANSWER, response)
    return answer if answer is not None and answer == gold.strip() else None


def equal_shortcut(response: str, gold: str) -> str | None:
    """The predicted answer when it is exactly the gold answer (the reference harness then skips the judge)."""
    return response.strip() if response.strip() == gold.strip() else None


LABELLED_TEMPLATE = """\
Grade a response to a question against the correct answer given below.

[question]: {question}

[response]: {response}

[correct_answer]: {correct_answer}

Reply with these four labelled lines, in this order:

extracted_final_answer: the final answer the [response] gives, copied as written; None if it gives no \
definite final answer.

reasoning: a short account of whether extracted_final_answer and [correct_answer] differ in any way that \
matters. Judge only whether they match: do not solve the question, discuss its background, or defend an answer \
other than [correct_answer].

correct: yes if extracted_final_answer agrees with [correct_answer], or is within a small margin of error for \
a numerical answer; no otherwise (any inconsistency, ambiguity, non-equivalence, or a wrong extracted answer).

confidence: the confidence between 0% and 100% that the [response] states; 100 if it states none.
"""

BROWSECOMP_ZH_TEMPLATE = """\
请对照下面给出的[correct_answer]，判断[response]对[question]的回答是否正确。

[question]: {question}

[response]: {response}

[correct_answer]: {correct_answer}

请按以下四行格式作答，顺序不变：

extracted_final_answer: 照原文摘录[response]给出的最终答案；若[response]没有明确的最终答案，写 None。

reasoning: 简要说明 extracted_final_answer 与 [correct_answer] 之间有无实质差异。只判断两者是否一致：不要解题，\
不要讨论题目背景，也不要为[correct_answer]以外的答案辩护。

correct: extracted_final_answer 与 [correct_answer] 一致（数值题允许很小的误差）时写 yes；否则（有任何不一致、歧义、\
不等价，或摘录的答案有误）写 no。

confidence: [response]中给出的置信度，介于 0% 到 100% 之间；若没有给出，写 100%。
"""

XBENCH_TEMPLATE = """\
请根据下面的[正确答案]，判断[回答]对[原问题]的作答是否正确。

[原问题]: {question}

[正确答案]: {correct_answer}

[回答]: {response}

请按以下格式给出判断：

最终答案: 摘录[回答]中的最终答案；若[回答]没有明确的最终答案，写 无。

解释: 对照[正确答案]，说明[最终答案]为何正确或错误。只看[最终答案]与[正确答案]有无实质差异：不要评论题目背景，\
不要重新解题，也不要为不同于[正确答案]的答案辩护。

结论: [最终答案]与[正确答案]一致，或数值题在可接受的小误差之内时，写 正确；否则（有任何不一致、歧义、不等价，\
或摘录的答案有误）写 错误。
"""

EQUIVALENT_TEMPLATE = """\
Decide whether the predicted answer to the question below means the same as the labeled answer.

Question: {question}

Labeled answer: {correct_answer}

Predicted answer: {response}

Is the predicted answer equivalent to the labeled answer? Reply with the single word "Correct" if it is, \
or "Incorrect" if it is not, and nothing else.
"""

_LABELLED_FIELDS = ("extracted_final_answer", "reasoning", "correct", "confidence")

PROFILES: dict[str, Profile] = {p.name: p for p in [
    # simple-evals BrowseComp grader (gpt-4.1-2025-04-14, max_tokens 2048).
    Profile("browsecomp", LABELLED_TEMPLATE, "You are a helpful assistant.", _LABELLED_FIELDS, parse_labelled),
    # HLE's judge (o3-mini with structured output upstream; the same fields, asked for as labelled lines here).
    Profile("hle", LABELLED_TEMPLATE, None, _LABELLED_FIELDS, parse_labelled),
    # BrowseComp-ZH's Chinese judge (gpt-4o, temperature 0.6, top-p 0.95).
    Profile("browsecomp-zh", BROWSECOMP_ZH_TEMPLATE, "you are a helpful assistant!", _LABELLED_FIELDS,
            parse_labelled),
    # xBench-DeepSearch's judge (gemini-2.0-flash).
    Profile("xbench", XBENCH_TEMPLATE, None, ("最终答案", "解释", "结论"), parse_xbench, xbench_shortcut),
    # The "equivalent" judge the reference harness uses for GAIA text-only and SEAL-0.
    Profile("equivalent", EQUIVALENT_TEMPLATE, None, ("Correct|Incorrect",), parse_equivalent, equal_shortcut,
            reads_answer=True),
]}


def load_template(path: Path) -> str:
    """A user's judge template, verbatim (UTF-8)."""
    return path.read_text(encoding="utf-8")


def profile_for(name: str, template: Path | None = None) -> Profile:
    """The named profile, its prompt replaced by the text of `template` when one is given (`--judge-template`)."""
    profile = PROFILES[name]
    return profile if template is None else replace(profile, template=load_template(template))


def fill(template: str, question: str, response: str, gold: str) -> str:
    """The template with its three placeholders filled in one pass: other braces stay, and a placeholder
    that appears inside the question or response is not filled again."""
    values = {"question": question, "response": response, "correct_answer": gold}
    return re.sub(r"\{(question|response|correct_answer)\}", lambda m: values[m.group(1)], template)


class JudgeUnavailable(Exception):
    """The judge endpoint could not be used (unreachable, refused, failing): not a verdict on the answer,
    so the caller stops or tries again later rather than scoring the answer."""


async def judge(profile: Profile, question: str, response: str, gold: str, config: JudgeConfig,
                client: httpx.AsyncClient) -> Verdict:
    """The judge's verdict on `response` to `question` with gold answer `gold`.

    Transport errors, 408/429/5xx answers and malformed verdicts are retried `config.retries` times;
    a judge that still gives no verdict yields `Verdict(correct=None, error=...)` rather than raising.
    """
    if profile.shortcut is not None and (same := profile.shortcut(response, gold)) is not None:
        return Verdict(correct=True, grader=profile.name, extracted=same,
                       reason="the answer equals the gold answer exactly; the judge was not asked")
    messages = [{"role": "user", "content": fill(profile.template, question, response, gold)}]
    if profile.system is not None:
        messages.insert(0, {"role": "system", "content": profile.system})
    error, unavailable = "", False
    for attempt in range(config.retries + 1):
        if attempt:
            await asyncio.sleep(config.retry_wait_s * 2 ** (attempt - 1))
        try:
            reading = profile.parse(await chat_text(client, config.base_url, config.model, config.api_key, messages,
                                                    config.temperature, config.max_tokens, config.timeout_s))
        except CallFailed as exc:
            error, unavailable = f"judge answered {exc}" if exc.status else f"judge {exc}", exc.unavailable
            if not exc.retry:
                break
            continue
        except MalformedVerdict as exc:
            error, unavailable = f"malformed verdict: {exc}", False
            continue
        return Verdict(correct=reading.correct, grader=profile.name, judge_model=config.model,
                       extracted=reading.extracted, reason=reading.reasoning, confidence=reading.confidence)
    if unavailable:
        raise JudgeUnavailable(error)
    return Verdict(correct=None, grader=profile.name, judge_model=config.model, error=error)
