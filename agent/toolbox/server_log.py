"""The tool servers' log: their stderr goes into a pipe, and a thread copies it line by line into
the log file with every secret replaced by `[REDACTED]` (a server's library may log the key it was
sent in an error message). Handing the servers the file itself would copy their words unread."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from nanbeige.agent.trajectory.trajectory_file import REDACTED, usable_secrets


class ServerLog:
    """Give `stream` to the servers as their stderr; `close` when they have stopped."""

    def __init__(self, path: Path, secrets: list[str]):
        self.path = path
        self._file = open(path, "ab")
        self._secrets = [s.encode() for s in usable_secrets(secrets)]
        read_end, write_end = os.pipe()
        self.stream = open(write_end, "w")
        """The pipe's writing end, a text stream with a file descriptor, as the MCP SDK wants."""
        self._copier = threading.Thread(target=self._copy, args=(read_end,), daemon=True)
        self._copier.start()

    def _copy(self, read_end: int) -> None:
        writable = True
        with open(read_end, "rb") as pipe:
            for line in pipe:  # until every writing end is closed
                if not writable:
                    continue  # still read: a server whose stderr pipe fills up would block
                for secret in self._secrets:
                    line = line.replace(secret, REDACTED.encode())
                try:
                    self._file.write(line)
                    self._file.flush()
                except (OSError, ValueError):  # a full disk, or closed after the wait in `close`
                    writable = False

    def size(self) -> int:
        """Bytes in the log so far (exact once closed)."""
        return self.path.stat().st_size if self.path.exists() else 0

    def close(self) -> None:
        """Close this process's writing end and wait for what the servers wrote to be copied. A
        process a server left behind may hold the pipe open: the wait is bounded."""
        if not self.stream.closed:
            self.stream.close()
            self._copier.join(timeout=5.0)
            self._file.close()
