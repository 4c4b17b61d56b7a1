"""What a tool call cost in paid units, counted where the paid request is made.

A tool server opens a meter around each call (`metered`); the code that talks to a paid service adds to
whatever meter is open (`add`), so the functions in between need not pass counts around. The meter lives
in a context variable: concurrent calls in one server each count their own.

Units (all summed per run, per eval and by `nanbeige show`):
    serper_queries   Serper search credits (the `credits` Serper reports for the query, else 1)
    jina_tokens      Jina Reader tokens, estimated as the returned text's characters / 4 (the markdown
                     format it is asked for carries no count)
    summary_tokens   tokens of the extraction model's calls (what its server reports)
    e2b_seconds      seconds E2B sandboxes were alive, counted as they pass
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

UNITS = ("serper_queries", "jina_tokens", "summary_tokens", "e2b_seconds")

_meter: ContextVar[dict[str, float] | None] = ContextVar("nanbeige_usage", default=None)


def add(unit: str, amount: float) -> None:
    """Count `amount` of `unit` against the call being served (nothing when no call is metered)."""
    meter = _meter.get()
    if meter is not None and amount:
        meter[unit] = meter.get(unit, 0) + amount


@contextmanager
def metered() -> Iterator[dict[str, float]]:
    """A fresh meter for one tool call; read it after the block."""
    meter: dict[str, float] = {}
    token = _meter.set(meter)
    try:
        yield meter
    finally:
        _meter.reset(token)
