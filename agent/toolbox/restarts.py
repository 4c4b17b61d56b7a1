"""A run's budget of tool-server restarts, which follows progress: a server that crashes now and then is
restarted for as long as it keeps answering in between; one that fails again at once stops being restarted."""

from __future__ import annotations

RESTART_CREDIT_CALLS = 10
"""Calls a restarted server must answer for a run before its restarts stop counting against the run's
budget: a server that crashes now and then is restarted for as long as it keeps working in between,
one that never gets that far (dies at start, or on every call) stops being restarted."""


class Restarts:
    """One run's budget of tool-server restarts: at most `Toolbox.max_restarts` restarts of a server in
    a row, where a row ends once the server has answered `RESTART_CREDIT_CALLS` of the run's calls."""

    def __init__(self) -> None:
        self.in_a_row: dict[str, int] = {}
        """Restarts since the server last made progress, by server."""
        self.answered: dict[str, int] = {}
        """Calls the server answered since its last restart, by server."""
        self.total: dict[str, int] = {}
        """Every restart this run made, by server (for the record)."""

    def spent(self, server: str) -> int:
        return self.in_a_row.get(server, 0)

    def restarted(self, server: str) -> None:
        self.in_a_row[server] = self.in_a_row.get(server, 0) + 1
        self.total[server] = self.total.get(server, 0) + 1
        self.answered[server] = 0

    def answered_call(self, server: str) -> None:
        self.answered[server] = self.answered.get(server, 0) + 1
        if self.answered[server] >= RESTART_CREDIT_CALLS:
            self.in_a_row[server] = 0
