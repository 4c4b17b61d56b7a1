"""What a run used, and the budgets that stop it.

A run's usage is summed from its turns as they are logged: model calls and tokens (prompt plus
completion tokens of every call, what an API bills), tool calls, and the paid units the built-in tool
servers report with each result (`nanbeige.tools.paid_units`: Serper queries, Jina tokens, extraction-model
tokens, E2B sandbox seconds). It goes into the trajectory's end record, the live view, `nanbeige show`
and eval reports. A budget caps any of `BUDGET_UNITS`; a run that reaches one stops with the stop
reason `budget` and is then asked for its answer, as at the turn limit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from nanbeige.tools.paid_units import UNITS as PAID_UNITS

BUDGET_UNITS = ("tokens", "tool_calls", *PAID_UNITS)

LABELS = {
    "tokens": "tokens",
    "tool_calls": "tool calls",
    "serper_queries": "Serper queries",
    "jina_tokens": "Jina tokens",
    "summary_tokens": "extraction tokens",
    "e2b_seconds": "E2B seconds",
}


def _number(value: Any) -> float:
    """A count read from a file or a server: a number, else 0 (a crafted record must not break a sum)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def add_turn(usage: dict[str, float], turn: Any) -> None:
    """Add one logged turn (a model call and its tool calls) to a run's usage, in place."""
    prompt, completion = _number(turn.usage.get("prompt_tokens")), _number(turn.usage.get("completion_tokens"))
    counts = {
        "model_calls": 1,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "tokens": prompt + completion,
        "tool_calls": len(turn.tool_calls),
    }
    for result in turn.tool_results:
        for unit, amount in (result.usage or {}).items():
            counts[unit] = counts.get(unit, 0) + _number(amount)
    for unit, amount in counts.items():
        usage[unit] = usage.get(unit, 0) + amount


def run_usage(turns: Iterable[Any]) -> dict[str, float]:
    """The usage of a run from its turns (for trajectories written before usage was recorded)."""
    usage: dict[str, float] = {}
    for turn in turns:
        add_turn(usage, turn)
    return usage


def total(usages: Iterable[dict[str, float] | None]) -> dict[str, float]:
    """Several runs' usage summed."""
    summed: dict[str, float] = {}
    for usage in usages:
        for unit, amount in (usage or {}).items():
            summed[unit] = summed.get(unit, 0) + _number(amount)
    return summed


def over_budget(usage: dict[str, float], budgets: dict[str, float]) -> str | None:
    """Why the run must stop (the first budget used up), or None."""
    for unit, limit in budgets.items():
        if usage.get(unit, 0) >= limit:
            return f"the budget of {limit:g} {LABELS.get(unit, unit)} is used up ({usage.get(unit, 0):g} used)"
    return None


def parse_budgets(texts: list[str]) -> dict[str, float]:
    """`UNIT=N` flags as a dict; ValueError naming the problem."""
    budgets = {}
    for text in texts:
        unit, sep, value = text.partition("=")
        unit = unit.strip()
        if not sep or unit not in BUDGET_UNITS:
            raise ValueError(f"--budget wants UNIT=N with UNIT one of {', '.join(BUDGET_UNITS)}, got {text!r}")
        try:
            budgets[unit] = float(value)
        except ValueError:
            raise ValueError(f"--budget {unit} wants a number, got {value!r}") from None
        if not math.isfinite(budgets[unit]) or budgets[unit] <= 0:
            raise ValueError(f"--budget {unit} must be a positive number, got {value!r}")
    return budgets


def usage_text(usage: dict[str, float] | None) -> str:
    """`12,345 tokens · 4 tool calls · 3 Serper queries`: what was used, zero units left out."""
    parts = []
    for unit in BUDGET_UNITS:
        amount = _number((usage or {}).get(unit))
        if amount:
            shown = f"{amount:,.1f}" if unit == "e2b_seconds" else f"{amount:,.0f}"
            parts.append(f"{shown} {LABELS[unit]}")
    return " · ".join(parts)
