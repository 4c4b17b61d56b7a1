"""What a person sees: the live view of a run on stderr, and `nanbeige show` for a saved one.
Every text that came from outside goes through `shown` first: keys out, control characters escaped."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape

from nanbeige.agent.backends.in_process import END_OF_TURN
from nanbeige.agent.cli.console import shown
from nanbeige.agent.run import dialects
from nanbeige.agent.run.usage import add_turn, run_usage, total, usage_text
from nanbeige.agent.trajectory.trajectory import ToolCall, Trajectory, Turn


def short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(shown(text).split())  # keys out before cutting: a cut key would no longer match
    return text if len(text) <= limit else text[: limit - 1] + "…"


def call_summary(call: ToolCall, limit: int = 60) -> str:
    arguments = ", ".join(f"{k}={short(v, limit)}" for k, v in call.arguments.items())
    return f"{shown(call.name)}({arguments})"


def turn_line(turn: Turn, number: int) -> str:
    """One line per turn: its number as `max_turns` counts, tokens, model latency, each tool call with its
    latency and status. A rolled-back reply carries the number of the turn sampled again in its place."""
    tokens = turn.usage.get("completion_tokens")
    head = f"[bold]turn {number}[/] [dim]{turn.latency_s:.1f}s" + (f" · {tokens} tok" if tokens else "") + "[/]"
    if turn.rolled_back:
        return f"{head} [yellow]reply rolled back, sampled again:[/] {escape(short(turn.format_error or '', 90))}"
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


def progress_every(default_s: float) -> float:
    """Seconds between progress lines where stderr is no terminal: NANBEIGE_PROGRESS_EVERY, else the
    view's own default."""
    import os

    try:
        value = float(os.environ.get("NANBEIGE_PROGRESS_EVERY") or default_s)
    except ValueError:
        return default_s
    return value if value > 0 else default_s


def elapsed(seconds: float) -> str:
    """`42s`, `3m05s`, `2h07m`: a span of time as the progress lines show it."""
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Ticker:
    """Where stderr is no terminal (a log file, CI, `nohup`, a notebook) nothing is redrawn: instead
    `text()` is printed as one plain line every `every_s` seconds, from a thread of its own, so that a
    long wait (a model thinking for minutes on a CPU) shows it is alive. `text()` returning None
    prints nothing that time."""

    def __init__(self, console: Console, text: Any, every_s: float):
        import threading

        self.console, self.text, self.every_s = console, text, every_s
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="nanbeige-progress", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(self.every_s):
            line = self.text()
            if line:
                self.console.print(line, highlight=False, soft_wrap=True)

    def stop(self) -> None:
        self.stopped.set()


class LiveView:
    """Renders loop events on stderr: a line per finished turn, and while the run waits (for the
    model, for a tool) what it waits for and what the run used so far: in a terminal a spinner line
    redrawn in place, elsewhere a plain line every few seconds."""

    def __init__(self, console: Console, max_turns: int, every_s: float | None = None):
        import time

        self.console = console
        self.max_turns = max_turns
        self.index = 0
        self.usage: dict[str, float] = {}
        self.started = time.monotonic()
        self.waiting: tuple[str, float] | None = None  # what the run waits for, and since when
        self.reply: list[str] = []  # the pieces of the reply streamed so far (the refresh thread joins them)
        # A new spinner for each wait: one restarted would first erase as many lines above it as the
        # last reply it showed had, which are the turn lines printed since.
        self.status: Any = None
        self.ticker = None if console.is_terminal else Ticker(console, self._status, every_s or progress_every(10))

    def __call__(self, kind: str, data: Any) -> None:
        if kind == "text":
            self.reply.append(data)
        elif kind == "model":
            self.index = data
            self._wait(WAITING_FOR_THE_MODEL)
        elif kind == "tool":
            self._wait(escape(call_summary(data, 40)))
        elif kind == "turn":
            add_turn(self.usage, data)
            self._stop_waiting()
            self.console.print(turn_line(data, self.index + 1), highlight=False)
        elif kind == "warning":
            head, _, rest = data.partition(": ")
            self.console.print(f"[yellow]{escape(head)}:[/] {escape(rest)}", highlight=False)
        elif kind == "end":
            self._stop_waiting()
            if self.ticker:
                self.ticker.stop()

    def _stop_waiting(self) -> None:
        self.waiting = None
        if self.status:
            self.status.stop()
            self.status = None

    def _head(self) -> str:
        used = usage_text(self.usage)
        return f"turn {self.index + 1}/{self.max_turns}" + (f" · [dim]{used}[/]" if used else "")

    def _status(self) -> str | None:
        """`turn 2/10 · 41s elapsed · writing the reply (12s, 312 characters so far)`: the run so far and what
        it waits for now (None while it waits for nothing); the same line in a terminal and in a log."""
        import time

        if self.waiting is None:
            return None
        what, since = self.waiting
        now = time.monotonic()
        streamed = len(self._reply())
        if streamed and what == WAITING_FOR_THE_MODEL:  # the model is no longer silent: it writes
            what = "writing the reply"
        so_far = f", {streamed:,} characters so far" if streamed else ""
        return f"{self._head()} · {elapsed(now - self.started)} elapsed · {what} ({elapsed(now - since)}{so_far})"

    def _wait(self, what: str) -> None:
        import time

        self.waiting, self.reply = (what, time.monotonic()), []
        if self.console.is_terminal and self.status is None:
            self.status = self.console.status(self)  # drawn through __rich__ at each refresh, as it is then
            self.status.start()

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        line, reply = Text.from_markup(self._status() or ""), self._reply()
        if not reply:
            return clear_of_the_edge(self.console, line, SPINNER_COLUMNS)
        # the head line and a margin take rows
        width = self.console.width - SPINNER_COLUMNS - EDGE_COLUMNS
        return clear_of_the_edge(
            self.console, Group(line, reply_tail(reply, width, self.console.height - 4)), SPINNER_COLUMNS
        )

    def _reply(self) -> str:
        """The reply streamed so far, without the token that ends a turn (`<|im_end|>`): a server or the
        in-process model may send it, and it is no text of the reply."""
        reply = "".join(self.reply)
        for token in END_OF_TURN:
            reply = reply.replace(token, "")
        return reply


WAITING_FOR_THE_MODEL = "waiting for the model"
SPINNER_COLUMNS = 2  # the spinner's frame and the space after it, left of what a live view draws
EDGE_COLUMNS = 2  # kept free at the right edge: `^C` is as wide


def clear_of_the_edge(console: Console, renderable: Any, used: int = 0) -> Any:
    """`renderable` drawn at most as wide as the terminal less `used` columns and two more. The terminal
    echoes Ctrl-C as `^C` where the cursor is; after a line as wide as the terminal that wraps onto a row the
    live display never drew, so it erased one row too few and left its last frame on screen."""
    from rich.constrain import Constrain

    return Constrain(renderable, width=max(console.width - used - EDGE_COLUMNS, 10))


def reply_tail(reply: str, width: int, height: int) -> Any:
    """The end of a reply being generated, as much as fills `height` rows of `width` columns, its
    reasoning (up to `</think>`, or all of it while a `<think>` is open) dimmed."""
    from rich.text import Text

    width, height = max(width, 10), max(height, 1)
    start, rows = len(reply), 0
    while start > 0 and rows < height:
        line_start = reply.rfind("\n", 0, start - 1) + 1  # of the line that ends at `start`, its newline included
        line = reply[line_start:start].rstrip("\n")
        needed = max(1, -(-len(line) // width))
        if rows + needed > height:  # only the end of this line fits
            start -= (height - rows) * width
            break
        rows, start = rows + needed, line_start
    closed = reply.find("</think>")
    thought_end = closed + len("</think>") if closed >= 0 else (len(reply) if "<think>" in reply else 0)
    cut = max(start, min(thought_end, len(reply)))
    return Text.assemble((shown(reply[start:cut]), "dim"), shown(reply[cut:]))


def show(console: Console, trajectory: Trajectory, full: bool = False) -> None:
    """Print a saved trajectory readably: question, turns (reasoning, calls, results), answer."""
    limit = None if full else 600
    cut = (lambda s: s) if full else (lambda s: s if len(s) <= limit else s[:limit] + f" … [{len(s)} chars]")
    console.rule(escape(shown(f"trajectory {trajectory.id} · {trajectory.model} · {trajectory.dialect}")))
    # --full: lines are left to the terminal to fold; rich's own folding of megabytes takes minutes
    console.print(f"[bold]question:[/] {escape(cut(shown(trajectory.question)))}", highlight=False, soft_wrap=full)
    counted = 0
    for turn in trajectory.turns:
        console.print()
        console.print(turn_line(turn, counted + 1), highlight=False)
        counted += not turn.rolled_back
        content = turn.assistant.get("content") or ""
        thought, _, _ = content.rpartition("</think>")
        if thought.strip():
            console.print(
                f"[dim]{escape(cut(shown(thought.replace('<think>', '').strip())))}[/]", highlight=False, soft_wrap=full
            )
        visible = dialects.visible_text(content).strip()
        if visible and not turn.tool_calls:
            console.print(escape(cut(shown(visible))), highlight=False, soft_wrap=full)
        if turn.format_error:
            console.print(f"[yellow]→ {escape(shown(turn.format_error))}[/]", highlight=False)
        for call, result in zip(turn.tool_calls, turn.tool_results):
            style = "red" if result.is_error else "blue"
            console.print(
                f"[{style}]{escape(shown(call.server))}/{escape(shown(call.name))}[/] "
                f"{escape(shown(json.dumps(call.arguments, ensure_ascii=False)))}",
                highlight=False,
            )
            console.print(f"[dim]{escape(cut(shown(result.text)))}[/]", highlight=False, soft_wrap=full)
    console.print()
    status = shown(trajectory.stop_reason or "unfinished (no end record)")
    console.print(
        f"[bold]stop reason:[/] {escape(status)}"
        + (f" · {escape(shown(trajectory.error))}" if trajectory.error else ""),
        highlight=False,
    )
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
    accuracy or pass rate so far, ETA (`estimating` until a run ends) and the time since the start; with
    `group_size`, questions done and turns/s too."""

    def __init__(self, console: Console, progress: Any, name: str, group_size: int | None = None):
        from rich.live import Live

        self.progress, self.name, self.group_size = progress, name, group_size
        self.console = console
        self.live = self.ticker = None
        if console.is_terminal:
            self.live = Live(console=console, get_renderable=self._render, refresh_per_second=4, transient=False)
            self.live.start()
        else:
            self.ticker = Ticker(console, self._plain_line, progress_every(30))

    def _render(self) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        grid = Table.grid(padding=(0, 1))
        grid.add_row(
            f"[bold]{escape(self.name)}[/]",
            ProgressBar(total=max(self.progress.total, 1), completed=self.progress.done, width=20),
            self._line(),
        )
        return clear_of_the_edge(self.console, grid)

    def _plain_line(self) -> str:
        return f"{escape(self.name)}: {self._line()}"

    def _line(self) -> str:
        p = self.progress
        rate = "-" if p.accuracy is None else f"{100 * p.accuracy:.1f}%"
        if self.group_size:
            line = (
                f"{p.groups_done}/{p.total // self.group_size} questions · {p.done}/{p.total} rollouts · "
                f"{p.running} running · pass rate {rate} · {self._turns_per_s()} turns/s · ETA {self._eta()}"
            )
        else:
            line = f"{p.done}/{p.total} runs · {p.running} running · accuracy {rate} · ETA {self._eta()}"
        line += f" · {elapsed(p.elapsed_s)} elapsed"
        if p.failed:
            line += f" · [yellow]{p.failed} failed[/]"
        return line

    def _turns_per_s(self) -> str:
        seconds = self.progress.elapsed_s
        return f"{self.progress.turns / seconds:.1f}" if seconds > 0 else "-"

    def _eta(self) -> str:
        p = self.progress
        eta = p.eta_s()  # the pace of this session's runs (`evals.progress`)
        if eta is None and p.timed and p.running:
            return f"unknown ({p.running} running, the longest for {elapsed(p.longest_running_s())})"
        return "estimating" if eta is None else elapsed(eta)

    def stop(self) -> None:
        if self.live:
            self.live.stop()
        if self.ticker:
            self.ticker.stop()
            self.console.print(self._plain_line(), highlight=False, soft_wrap=True)


class LiveLine:
    """One line on stderr, redrawn four times a second from `text()` until stopped; where stderr is no
    terminal, printed every 30 seconds instead."""

    def __init__(self, console: Console, text: Any):
        from rich.live import Live
        from rich.text import Text

        self.live = self.ticker = None
        if console.is_terminal:
            self.live = Live(
                console=console,
                get_renderable=lambda: clear_of_the_edge(console, Text.from_markup(text())),
                refresh_per_second=4,
                transient=True,
            )  # gone when done: the command's summary line follows
            self.live.start()
        else:
            self.ticker = Ticker(console, text, progress_every(30))

    def stop(self) -> None:
        if self.live:
            self.live.stop()
        if self.ticker:
            self.ticker.stop()
