"""A command run in a real pseudo-terminal, as a person runs it: its stdin, stdout and stderr are the
terminal, which is its controlling terminal (so the terminal's Ctrl-C reaches it as SIGINT), and what the
person sees is what a VT100 emulator (pyte) draws from everything the command wrote."""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import struct
import subprocess
import termios
import threading
import time

import pyte


def _take_the_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # the new session's controlling terminal: stdin's


class Terminal:
    """`with Terminal([...]) as term:`; `term.screen_text()` is what the screen shows now."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str] | None = None,
        cols: int = 120,
        rows: int = 40,
        cwd: str | None = None,
    ):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        environment = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in ("COLUMNS", "LINES")}
        environment["TERM"] = "xterm-256color"
        environment.pop("NO_COLOR", None)
        self.process = subprocess.Popen(
            args,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=environment,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_take_the_terminal,
        )
        os.close(slave)
        self.master = master
        self.screen = pyte.HistoryScreen(cols, rows, history=2000)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                return
            if not data:
                return
            with self.lock:
                self.raw += data
                self.stream.feed(data)

    def screen_text(self) -> str:
        """The lines scrolled off the top, then the screen, trailing blanks cut; a line the terminal
        folded at its right edge is joined again with its rest."""
        with self.lock:
            above = [
                "".join(self.screen.history.top[i][x].data for x in range(self.screen.columns))
                for i in range(len(self.screen.history.top))
            ]
            lines = above + self.screen.display
        text = ""
        for line in lines:
            text += line if len(line.rstrip()) == self.screen.columns else line.rstrip() + "\n"
        return text.rstrip()

    def shows(self, text: str, seconds: float) -> bool:
        """Whether `text` is on the screen within `seconds`."""
        deadline = time.monotonic() + seconds
        while text not in self.screen_text():
            if time.monotonic() > deadline or self.process.poll() is not None and not self.reader.is_alive():
                return text in self.screen_text()
            time.sleep(0.05)
        return True

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")  # the terminal's line discipline turns it into SIGINT

    def wait(self, seconds: float) -> int:
        code = self.process.wait(timeout=seconds)
        self.reader.join(timeout=5)
        return code

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.reader.join(timeout=5)
        os.close(self.master)
