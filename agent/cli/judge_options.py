"""The flags of the LLM judge (`eval`, `judge`) and of the turn critic (`judge`, `loop`), as typed Typer options,
and the endpoints their values make; a flag left out keeps the endpoint's own default."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from nanbeige.agent.cli.options import endpoints, option
from nanbeige.tools.endpoint import OPENAI_BASE_URL, ChatEndpoint

# The LLM judge, for `eval` and `judge`.
JudgeBaseUrl = Annotated[
    list[str] | None,
    typer.Option(
        envvar="NANBEIGE_JUDGE_BASE_URL",
        show_default=False,
        help=(
            f"OpenAI-compatible endpoint of the LLM judge \\[default: {OPENAI_BASE_URL}]; repeat it for several "
            "serving the same model."
        ),
    ),
]
CriticBaseUrl = Annotated[
    list[str] | None,
    typer.Option(
        envvar="NANBEIGE_CRITIC_BASE_URL",
        show_default=False,
        help=(
            f"OpenAI-compatible endpoint of the turn critic \\[default: {OPENAI_BASE_URL}]; repeat it for several "
            "serving the same model."
        ),
    ),
]
CRITIC: dict[str, tuple[Any, Any]] = {
    "critic_base_url": (CriticBaseUrl, None),
    "critic_model": option(
        str | None,
        None,
        envvar="NANBEIGE_CRITIC_MODEL",
        show_default=False,
        help="The critic model \\[default: gpt-4.1-2025-04-14].",
    ),
    "critic_api_key": option(
        str | None, None, envvar="NANBEIGE_CRITIC_API_KEY", show_default=False, help="API key for the critic endpoint."
    ),
}
"""The turn critic's endpoint, as `judge` and `loop` take it (`critic_endpoint` makes it)."""
JudgeModel = Annotated[
    str | None,
    typer.Option(
        envvar="NANBEIGE_JUDGE_MODEL",
        show_default=False,
        help=("The judge model \\[default: the grader's own: its source's judge model]."),
    ),
]
JudgeApiKey = Annotated[
    str | None,
    typer.Option(envvar="NANBEIGE_JUDGE_API_KEY", show_default=False, help="API key for the judge endpoint."),
]
JudgeTemplate = Annotated[
    Path | None,
    typer.Option(
        show_default=False,
        help=(
            "The judge prompt, verbatim from a file (an official template, to reproduce published numbers); "
            "{question}, {response} and {correct_answer} are filled in."
        ),
    ),
]


def judge_endpoint(
    base_url: list[str] | str | None, model: str | None, api_key: str | None, template: Path | None
) -> ChatEndpoint:
    """The LLM judge's endpoint from its flags (unset ones keep `JUDGE_ENDPOINT`'s defaults)."""
    from nanbeige.evals.judges import JUDGE_ENDPOINT

    return replace(
        JUDGE_ENDPOINT,
        **endpoints(base_url, JUDGE_ENDPOINT.base_url),
        model=model or JUDGE_ENDPOINT.model,
        api_key=api_key,
        template=template,
    )


def complexity_endpoint(base_url: list[str] | str | None, model: str | None, api_key: str | None) -> ChatEndpoint:
    """The time reward's complexity judge from the LLM judge's flags (unset ones keep `COMPLEXITY_ENDPOINT`'s)."""
    from nanbeige.evals.complexity import COMPLEXITY_ENDPOINT

    return replace(
        COMPLEXITY_ENDPOINT,
        **endpoints(base_url, COMPLEXITY_ENDPOINT.base_url),
        model=model or COMPLEXITY_ENDPOINT.model,
        api_key=api_key,
    )


def critic_endpoint(
    base_url: list[str] | str | None, model: str | None, api_key: str | None, template: Path | None = None
) -> ChatEndpoint:
    """The turn critic's endpoint from its flags (unset ones keep `CRITIC_ENDPOINT`'s defaults)."""
    from nanbeige.trainer.critic import CRITIC_ENDPOINT

    return replace(
        CRITIC_ENDPOINT,
        **endpoints(base_url, CRITIC_ENDPOINT.base_url),
        model=model or CRITIC_ENDPOINT.model,
        api_key=api_key,
        template=template,
    )
