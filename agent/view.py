"""What a person sees: the live view of a run on stderr, and `nanbeige show` for a saved one.
Every text that came from outside goes through `shown` first: keys out, control characters escaped."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape

from nanbeige.agent import dialects
from nanbeige.agent.console import shown
from nanbeige.agent.trajectory import ToolCall, Trajectory, Turn
from nanbeige.agent.usage import add_turn, run_usage, total, usage_text


def short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(shown(text).split())  # keys out before cutting: a cut key would no longer match
    return text if len(text) <= limit else text[: limit - 1] + "…"


def call_summary(call: ToolCall, limit: int = 60) -> str:
    arguments = ", ".join(f"{k}={short(v, limit)}" for k, v in call.arguments.items())
    return f"{shown(call.name)}({arguments})"


def turn_line(turn: Turn) -> str:
    """One line per turn: tokens, model latency, each tool call with its latency and status."""
    tokens = turn.usage.get("completion_tokens")
    head = f"[bold]turn {turn.index + 1}[/] [dim]{turn.latency_s:.1f}s" + (f" · {tokens} tok" if tokens else "") + "[/]"
    if turn.format_error:
        return f"{head} [yellow]unusable reply:[/] {escape(short(turn.format_error, 90))}"
    if turn.instruction:
        return f"{head} [cyan]final answer requested[/]"
    if not turn.tool_calls:
        return f"{head} [green]answered[/]"
    parts = []
    for call, result in zip(turn.tool_calls, turn.tool_results):
        mark = "[red]✗[/]" if result.is_error else "[green]✓[/]"
        parts.append(f"{escape(call_summary(call))} [dim]{result.latency_s:.1f}s[/] {mark}")
    return f"{head} " + "; ".join(parts)


class LiveView:
    """Renders loop events on stderr: a spinner while waiting (with what the run used so far), a line
    per finished turn."""

    def __init__(self, console: Console, max_turns: int):
        self.console = console
        self.max_turns = max_turns
        self.status = console.status("")
        self.index = 0
        self.usage: dict[str, float] = {}

    def __call__(self, kind: str, data: Any) -> None:
        if kind == "model":
            self.index = data
            self._wait(f"turn {data + 1}/{self.max_turns}{self._used()} · waiting for the model")
        elif kind == "tool":
            self._wait(f"turn {self.index + 1}/{self.max_turns}{self._used()} · {escape(call_summary(data, 40))}")
        elif kind == "turn":
            add_turn(self.usage, data)
            self.status.stop()
            self.console.print(turn_line(data), highlight=False)
        elif kind == "end":
            self.status.stop()

    def _used(self) -> str:
        used = usage_text(self.usage)
        return f" · [dim]{used}[/]" if used else ""

    def _wait(self, text: str) -> None:
        self.status.update(text)
        self.status.start()


def show(console: Console, trajectory: Trajectory, full: bool = False) -> None:
    """Print a saved trajectory readably: question, turns (reasoning, calls, results), answer."""
    limit = None if full else 600
    cut = (lambda s: s) if full else (lambda s: s if len(s) <= limit else s[:limit] + f" … [{len(s)} chars]")
    console.rule(escape(shown(f"trajectory {trajectory.id} · {trajectory.model} · {trajectory.dialect}")))
    # --full: lines are left to the terminal to fold; rich's own folding of megabytes takes minutes
    console.print(f"[bold]question:[/] {escape(cut(shown(trajectory.question)))}", highlight=False, soft_wrap=full)
    for turn in trajectory.turns:
        console.print()
        console.print(turn_line(turn), highlight=False)
        content = turn.assistant.get("content") or ""
        thought, _, _ = content.rpartition("</think>")
        if thought.strip():
            console.print(f"[dim]{escape(cut(shown(thought.replace('<think>', '').strip())))}[/]", highlight=False,
                          soft_wrap=full)
        visible = dialects.visible_text(content).strip()
        if visible and not turn.tool_calls:
            console.print(escape(cut(shown(visible))), highlight=False, soft_wrap=full)
        if turn.format_error:
            console.print(f"[yellow]→ {escape(shown(turn.format_error))}[/]", highlight=False)
        for call, result in zip(turn.tool_calls, turn.tool_results):
            style = "red" if result.is_error else "blue"
            console.print(f"[{style}]{escape(shown(call.server))}/{escape(shown(call.name))}[/] "
                          f"{escape(shown(json.dumps(call.arguments, ensure_ascii=False)))}", highlight=False)
            console.print(f"[dim]{escape(cut(shown(result.text)))}[/]", highlight=False, soft_wrap=full)
    console.print()
    status = shown(trajectory.stop_reason or "unfinished (no end record)")
    console.print(f"[bold]stop reason:[/] {escape(status)}" +
                  (f" · {escape(shown(trajectory.error))}" if trajectory.error else ""), highlight=False)
    console.print(f"[bold]answer:[/] {escape(shown(trajectory.answer or '(none)'))}", highlight=False)
    used = usage_text(trajectory.usage or run_usage(trajectory.turns))
    if used:
        console.print(f"[bold]used:[/] {used}", highlight=False)


def show_total(console: Console, trajectories: list[Trajectory]) -> None:
    """The usage of all the file's trajectories together (after `show` of each)."""
    used = usage_text(total(t.usage or run_usage(t.turns) for t in trajectories))
    console.rule(f"{len(trajectories)} trajectories")
    console.print(f"[bold]used in all:[/] {used or 'nothing recorded'}", highlight=False)


class RunsView:
    """A live line on stderr while many runs go (an eval, a collection): a bar, runs done, running,
    accuracy or pass rate so far, and ETA; with `group_size`, questions done and turns/s too."""

    def __init__(self, console: Console, progress: Any, name: str, group_size: int | None = None):
        from rich.live import Live

        self.progress, self.name, self.group_size = progress, name, group_size
        self.resumed = progress.done  # runs done before this session: not part of its pace
        self.live = Live(console=console, get_renderable=self._render, refresh_per_second=4, transient=False)
        self.live.start()

    def _render(self) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        p = self.progress
        rate = "-" if p.accuracy is None else f"{100 * p.accuracy:.1f}%"
        if self.group_size:
            line = (f"{p.groups_done}/{p.total // self.group_size} questions · {p.done}/{p.total} rollouts · "
                    f"{p.running} running · pass rate {rate} · {self._turns_per_s()} turns/s · ETA {self._eta()}")
        else:
            line = f"{p.done}/{p.total} runs · {p.running} running · accuracy {rate} · ETA {self._eta()}"
        if p.failed:
            line += f" · [yellow]{p.failed} failed[/]"
        grid = Table.grid(padding=(0, 1))
        grid.add_row(f"[bold]{escape(self.name)}[/]", ProgressBar(total=max(p.total, 1), completed=p.done, width=20),
                     line)
        return grid

    def _turns_per_s(self) -> str:
        import time

        elapsed = time.monotonic() - self.progress.started
        return f"{self.progress.turns / elapsed:.1f}" if elapsed > 0 else "-"

    def _eta(self) -> str:
        import time

        p = self.progress
        finished = p.done - self.resumed
        if finished <= 0:
            return "-"
        seconds = (time.monotonic() - p.started) / finished * (p.total - p.done)
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m" if seconds >= 3600 else \
            f"{int(seconds // 60)}m{int(seconds % 60):02d}s"

    def stop(self) -> None:
        self.live.stop()


class LiveLine:
    """One line on stderr, redrawn four times a second from `text()` until stopped."""

    def __init__(self, console: Console, text: Any):
        from rich.live import Live
        from rich.text import Text

        self.live = Live(console=console, get_renderable=lambda: Text.from_markup(text()), refresh_per_second=4,
                         transient=True)  # gone when done: the command's summary line follows
        self.live.start()

    def stop(self) -> None:
        self.live.stop()
