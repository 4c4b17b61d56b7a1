"""LLM judges, two families per benchmark, each as its source grades:

- `official`: the benchmark authors' grader (simple-evals for BrowseComp, HLE's judge, BrowseComp-ZH's,
  xbench-evals'); `official-fixed` where the source has a bug (simple-evals BrowseComp: see `verdicts.py`);
- `reference`: the reference harness's evaluator (MiroThinker `benchmarks/evaluators/eval_utils.py`), which
  produced the paper's table, and so the default.

A profile keeps its source's facts: the judge model, exactly the request fields it sends (no temperature
for o-series models, `max_completion_tokens` where the source uses it, structured output where it uses
it), what the judge is shown (the agent's whole final response, or its boxed answer), the verdict rule
(`verdicts.py`), what happens to a reply without a verdict, and any shortcut that skips the judge. The
prompts are ours (`judge_prompts.py`) with the source's inputs, fields and decision rule; a source's own
text goes in with `--judge-template FILE`.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import httpx

from nanbeige.evals import judge_prompts as prompts
from nanbeige.evals import verdicts
from nanbeige.evals.endpoint import CallFailed, chat
from nanbeige.evals.tasks import Verdict
from nanbeige.evals.verdicts import Reading
from nanbeige.tools.endpoint import OPENAI_BASE_URL, ChatEndpoint
from nanbeige.tools.errors import ServiceUnavailable

FAMILIES = ("reference", "official", "official-fixed")


@dataclass(frozen=True)
class Profile:
    """One judge as its source runs it."""

    name: str
    """What results record as their grader: `<benchmark>/<family>` (`browsecomp/official`, ...)."""
    source: str
    """Where the rules come from: repository, file, commit."""
    template: str
    """The user message, with `{question}`, `{response}` and `{correct_answer}` to fill."""
    model: str
    """The source's judge model (`--judge-model` replaces it)."""
    parse: Callable[[str], Reading | None]
    """The source's verdict rule; None where it finds no verdict."""
    request: dict[str, Any] = field(default_factory=dict)
    """The sampling fields the source sends, exactly (none: the API's defaults)."""
    system: str | None = None
    """The system message the source sends, if any."""
    schema: Any = None
    """The pydantic model of the source's structured output (its `response_format`), if it uses one."""
    shows: str = "response"
    """What `{response}` is: `response`, the agent's whole final response (the text of the turn the answer
    came from, without reasoning); or `answer`, its boxed answer (the reference harness's judges)."""
    shortcut: Callable[[str, str], str | None] | None = None
    """Given (what is shown, gold): the matching answer when the source counts it right without a judge."""
    attempts: int = 1
    """How many times the source asks while a reply holds no verdict (the reference harness: 10)."""
    wait_s: float = 0.0
    """The source's wait between those attempts."""
    confidence: bool = False
    """Whether the source reads a confidence (for calibration)."""
    formatted: bool = False
    """The template is the source's own text (from a reference checkout), filled by `str.format` as the
    source fills it, rather than by `fill`."""


def _equal(shown: str, gold: str) -> str | None:
    """The reference harness's shortcut: the boxed answer equal to the gold answer, as Python strings."""
    return shown if shown == gold else None


def _xbench_equal(shown: str, gold: str) -> str | None:
    """xbench-evals' shortcut: the response's first `最终答案` equal to the gold answer."""
    answer = verdicts.xbench_answer(shown)
    return answer if answer == gold else None


SIMPLE_EVALS = "openai/simple-evals browsecomp_eval.py, simple_evals.py (ee3b031)"
MIROTHINKER = "MiroMindAI/MiroThinker apps/miroflow-agent/benchmarks/evaluators/eval_utils.py (370f983)"
GPT41 = "gpt-4.1-2025-04-14"
_REFERENCE = {"shows": "answer", "shortcut": _equal, "attempts": 10, "wait_s": 5.0}

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in [
        Profile(
            "browsecomp/official",
            SIMPLE_EVALS,
            prompts.LABELLED_TEMPLATE,
            GPT41,
            verdicts.simple_evals,
            {"temperature": 0.5, "max_tokens": 2048},
            system="You are a helpful assistant.",
        ),
        Profile(
            "browsecomp/official-fixed",
            SIMPLE_EVALS + " with PR #93's group(1)",
            prompts.LABELLED_TEMPLATE,
            GPT41,
            verdicts.simple_evals_fixed,
            {"temperature": 0.5, "max_tokens": 2048},
            system="You are a helpful assistant.",
        ),
        Profile(
            "browsecomp/reference",
            MIROTHINKER,
            prompts.CHOICE_TEMPLATE,
            GPT41,
            verdicts.choice_ab,
            {"max_completion_tokens": 2},
            **_REFERENCE,
        ),
        Profile(
            "browsecomp-zh/official",
            "PALIN2018/BrowseComp-ZH run.py, run_acc_calibration_error.py (86abe63)",
            prompts.BROWSECOMP_ZH_TEMPLATE,
            "gpt-4o",
            verdicts.browsecomp_zh,
            {"temperature": 0.6, "top_p": 0.95},
            system="you are a helpful assistant!",
            confidence=True,
        ),
        Profile(
            "browsecomp-zh/reference",
            MIROTHINKER,
            prompts.CHOICE_TEMPLATE_ZH,
            GPT41,
            verdicts.choice_ab,
            {"max_completion_tokens": 2},
            **_REFERENCE,
        ),
        Profile(
            "hle/official",
            "centerforaisafety/hle hle_eval/run_judge_results.py (87c92ea)",
            prompts.JSON_TEMPLATE,
            "o3-mini-2025-01-31",
            verdicts.hle,
            {"max_completion_tokens": 4096},
            schema=verdicts.ExtractedAnswer,
            confidence=True,
        ),
        Profile(
            "hle/reference",
            MIROTHINKER,
            prompts.JSON_TEMPLATE,
            "o3-mini-2025-01-31",
            verdicts.hle_reference,
            {"max_completion_tokens": 4096},
            schema=verdicts.HLEExtractedAnswer,
            **_REFERENCE,
        ),
        Profile(
            "xbench/official",
            "xbench-ai/xbench-evals eval_grader.py (17c5621)",
            prompts.XBENCH_TEMPLATE,
            "gemini-2.0-flash",
            verdicts.xbench,
            shortcut=_xbench_equal,
        ),
        Profile(
            "xbench/reference", MIROTHINKER, prompts.XBENCH_TEMPLATE, GPT41, verdicts.xbench_reference, **_REFERENCE
        ),
        Profile(
            "equivalent/reference", MIROTHINKER, prompts.EQUIVALENT_TEMPLATE, GPT41, verdicts.equivalent, **_REFERENCE
        ),
    ]
}

JUDGED = {
    "browsecomp": "browsecomp",
    "browsecomp-zh": "browsecomp-zh",
    "hle": "hle",
    "hle-500": "hle",
    "xbench-2505": "xbench",
    "xbench-2510": "xbench",
    "gaia": "equivalent",
    "gaia-text-103": "equivalent",
    "seal-0": "equivalent",
    "questions": "equivalent",
}
"""Each deep-search benchmark's judges, by the name they share (GAIA and SEAL-0: the reference harness's
"equivalent" judge; their official grader is GAIA's scorer, `gaia-exact`, and SEAL-0 publishes none). A questions
file of the user's own is judged as GAIA is; its default grader is GAIA's scorer, the loop's reward's."""


ALIASES = {
    "browsecomp": "browsecomp/reference",
    "browsecomp-zh": "browsecomp-zh/reference",
    "hle": "hle/reference",
    "xbench": "xbench/reference",
    "equivalent": "equivalent/reference",
}
"""The graders' names in trajectories and results of earlier releases, read as their benchmark's default."""


def in_family(name: str, family: str) -> str:
    """The grader of `family` for the benchmark whose grader is `name` (`hle/reference`, `official`:
    `hle/official`), for graders named in trajectories."""
    name = ALIASES.get(name, name)
    if name == "gaia-exact" or name.startswith("equivalent/"):
        return "gaia-exact" if family.startswith("official") else "equivalent/reference"
    prefix = name.split("/")[0]
    chosen = f"{prefix}/{family}"
    return chosen if chosen in PROFILES else f"{prefix}/official"


def grader_name(bench: str, family: str) -> str:
    """The grader a family names for a benchmark: a profile, or `gaia-exact`. ValueError when there is none."""
    if family not in FAMILIES:
        raise ValueError(f"--grader must be one of {', '.join(FAMILIES)} (or a grader's full name), not {family!r}")
    if family.startswith("official") and (bench.startswith("gaia") or bench == "questions"):
        return "gaia-exact"
    if family.startswith("official") and bench == "seal-0":
        raise ValueError(
            "SEAL-0's authors publish no grader (a GPT-4o-mini judge adapted from SimpleQA is described, "
            "not released): use --grader reference"
        )
    name = f"{JUDGED[bench]}/{family}"
    if name not in PROFILES and family == "official-fixed":
        name = f"{JUDGED[bench]}/official"  # no bug to fix in this source
    return name


JUDGE_ENDPOINT = ChatEndpoint(base_url=OPENAI_BASE_URL, model=None, timeout_s=300.0, retries=3, retry_wait_s=1.0)
"""The LLM judge's defaults (`--judge-*`, NANBEIGE_JUDGE_*): OpenAI's API; each profile's own model (recorded in
every verdict); 300 s a call, since an o-series judge reasons before it answers; asked again 3 times."""


def load_template(path: Path) -> str:
    """A user's judge template, verbatim (UTF-8)."""
    return path.read_text(encoding="utf-8")


def profile_for(name: str, template: Path | None = None, reference_prompts: dict[str, str] | None = None) -> Profile:
    """The named profile, its prompt replaced by the text of `template` when one is given, else, for a
    reference grader, by the reference checkout's own prompt where `reference_prompts` (its evaluator's,
    `Reference.judge_prompts`) has it."""
    profile = PROFILES[name]
    if template is not None:
        return replace(profile, template=load_template(template))
    shared = name.split("/")[0]
    if name.endswith("/reference") and shared in (reference_prompts or {}):
        return replace(profile, template=reference_prompts[shared], formatted=True)  # type: ignore[index]
    return profile


def fill(template: str, question: str, response: str, gold: str) -> str:
    """The template with its three placeholders filled in one pass: other braces stay, and a placeholder
    that appears inside the question or response is not filled again."""
    values = {"question": question, "response": response, "correct_answer": gold}
    return re.sub(r"\{(question|response|correct_answer)\}", lambda m: values[m.group(1)], template)


class JudgeUnavailable(ServiceUnavailable):
    """The judge endpoint could not be used (unreachable, refused, failing): not a verdict on the answer,
    so the caller stops or tries again later rather than scoring the answer."""


def request_body(profile: Profile, model: str, question: str, shown: str, gold: str) -> dict[str, Any]:
    """What the source sends: the model, its messages, exactly its sampling fields, its output schema."""
    content = (
        profile.template.format(question=question, correct_answer=gold, response=shown)
        if profile.formatted
        else fill(profile.template, question, shown, gold)
    )
    messages = [{"role": "user", "content": content}]
    if profile.system is not None:
        messages.insert(0, {"role": "system", "content": profile.system})
    body: dict[str, Any] = {"model": model, "messages": messages, **profile.request}
    if profile.schema is not None:
        body["response_format"] = verdicts.response_format(profile.schema)
    return body


async def judge(
    profile: Profile, question: str, shown: str, gold: str, config: ChatEndpoint, client: httpx.AsyncClient
) -> Verdict:
    """The judge's verdict on `shown` (the response, or the answer: `profile.shows`) against `gold`.

    A reply without a verdict is asked again as the source does (`attempts`, `wait_s`), then recorded as
    `Verdict(correct=None)` (counted wrong, reported apart). Transport errors and 408/429/5xx answers are
    retried `config.retries` times; an endpoint that still fails raises `JudgeUnavailable`."""
    model = config.model or profile.model
    if profile.shortcut is not None and (same := profile.shortcut(shown, gold)) is not None:
        return Verdict(
            correct=True,
            grader=profile.name,
            extracted=same,
            reason="the answer equals the gold answer exactly; the judge was not asked",
        )
    body = request_body(profile, model, question, shown, gold)
    error = ""
    for attempt in range(profile.attempts):
        if attempt:
            await asyncio.sleep(profile.wait_s)
        reply = await ask_judge(body, config, client)
        reading = profile.parse(reply)
        if reading is not None:
            return Verdict(
                correct=reading.correct,
                grader=profile.name,
                judge_model=model,
                extracted=reading.extracted,
                reason=reading.reasoning,
                confidence=reading.confidence,
            )
        error = f"no verdict in the judge's reply: {reply[:120]!r}"
    return Verdict(correct=None, grader=profile.name, judge_model=model, error=error)


async def ask_judge(body: dict[str, Any], config: ChatEndpoint, client: httpx.AsyncClient) -> str:
    """One reply's text, transport failures retried; JudgeUnavailable when the endpoint keeps failing."""
    error = ""
    for attempt in range(config.retries + 1):
        if attempt:
            await asyncio.sleep(config.retry_wait_s * 2 ** (attempt - 1))
        try:
            return await chat(client, config, body)
        except CallFailed as exc:
            error = f"judge answered {exc}" if exc.status else f"judge {exc}"
            if not exc.unavailable:  # an answer that is not a completion: no verdict in it
                return ""
            if not exc.retry:
                break
    raise JudgeUnavailable(error)
