"""The bounds of the run settings that are numbers, declared once: the command line's flags take theirs from
here (`bounds`), and the Python API checks the settings a caller names against the same (`range_problem`),
so that `ask(..., max_turns=-1)` is refused as `nanbeige ask --max-turns -1` is."""

from __future__ import annotations

import math
from typing import Any, Callable

import typer

RANGES: dict[str, tuple[float | None, float | None]] = {
    "max_turns": (1, None),
    "keep_tool_results": (-1, None),
    "max_context": (1024, None),
    "temperature": (0.0, None),
    "top_p": (0.0, 1.0),
    "repetition_penalty": (0.0, None),
    "max_tokens": (1, None),
    "timeout": (1, None),
    "request_timeout": (0.1, None),
    "tool_timeout": (1, None),
    "max_result_chars": (100, None),
}
"""Each setting's least and greatest value (None: no bound), by the name its `nanbeige ask` flag and its
Python API override share. NaN and infinity are outside every range: a comparison with NaN is never true,
so a bound alone would let it through."""


def range_problem(name: str, value: float) -> str | None:
    """Why `value` is outside the range of setting `name`, or None when it is inside."""
    low, high = RANGES[name]
    if not math.isfinite(value):
        return f"{name} must be a finite number, not {value}"
    if (low is not None and value < low) or (high is not None and value > high):
        wanted = f"at least {low}" if high is None else f"from {low} to {high}"
        return f"{name} must be {wanted}, not {value}"
    return None


def bounds(name: str) -> dict[str, Any]:
    """The `typer.Option` settings that hold flag `name` to its range: click's own bounds (shown in the help),
    and a check that also refuses NaN and infinity, which click's bounds let through."""
    low, high = RANGES[name]
    return {"min": low, "max": high, "callback": _finite(name)}


def _finite(name: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            raise typer.BadParameter(f"must be a finite number, not {value}")
        return value

    check.__name__ = f"finite_{name}"
    return check
