"""The agent's tools, reached only through MCP (the official `mcp` SDK).

A stdio server is launched once and kept alive for every run that shares the toolbox; if it dies
mid-run, or it hangs (a call timed out and the server answers nothing more, or three calls in a row
timed out), it is restarted
(once per run, by default) and the model is told to make the call again (it is not retried
blindly: the call may be what killed the server). Once a run's restarts are spent, its calls to
that server fail at once with a message saying so, instead of each waiting out the timeout. Streamable-HTTP servers are
reached by URL. Every call has a timeout, long results are cut with a visible marker, and anything
that goes wrong inside a call comes back as an error result the model can read; only a server that
cannot start at all is an error for the user.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any

from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from nanbeige.agent.toolbox.cache import ToolCache
from nanbeige.agent.toolbox.lifeline import tied_to_this_process
from nanbeige.agent.toolbox.restarts import RESTART_CREDIT_CALLS, Restarts
from nanbeige.agent.toolbox.server_env import passed_env
from nanbeige.agent.toolbox.tool_results import (
    defuse_control_tokens,
    failure_prefix,
    origin,
    paid_usage,
    redact_values,
    result_text,
    truncate,
)
from nanbeige.agent.trajectory.trajectory import ToolCall, ToolResult
from nanbeige.agent.trajectory.trajectory_file import redact, usable_secrets
from nanbeige.tools.errors import NanbeigeError

PING_TIMEOUT_S = 5.0  # after a call timed out, how long the server gets to answer before it counts as hung
HUNG_AFTER_TIMEOUTS = 3  # calls in a row that time out make a server count as hung, even if it still answers


class ToolboxError(NanbeigeError):
    """A server could not be started or reached: something the user must fix."""

    def __init__(self, message: str, logged: bool = False):
        super().__init__(message)
        self.logged = logged
        """The failed server's own output went to the servers' log (a stdio server's stderr): worth reading."""


@dataclass
class ServerSpec:
    """One MCP server to connect to."""

    name: str
    """The server name the model sees."""
    command: list[str] | None = None
    """Command line of a stdio server."""
    url: str | None = None
    """URL of a streamable-HTTP server."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment for a stdio server (it gets only this, plus PATH and HOME)."""
    server: Any = None
    """An in-process server object (tests and embedding)."""

    def target(self, errlog: IO[str]) -> Any:
        if self.server is not None:
            return self.server
        if self.url:
            return self.url
        assert self.command, f"server {self.name} has no command, url or server object"
        command = tied_to_this_process(self.command)  # a runtime killed outright takes its servers with it
        params = StdioServerParameters(command=command[0], args=command[1:], env=self.env)
        return stdio_client(params, errlog=errlog)


def parse_server_spec(text: str) -> ServerSpec:
    """`NAME=SPEC`: SPEC is an http(s) URL or the command line of a stdio server."""
    name, sep, spec = text.partition("=")
    if not sep or not name.strip() or not spec.strip():
        raise ValueError(f"--mcp wants NAME=COMMAND or NAME=URL, got {text!r}")
    spec = spec.strip()
    if spec.startswith(("http://", "https://")):
        return ServerSpec(name=name.strip(), url=spec)
    return ServerSpec(name=name.strip(), command=shlex.split(spec), env=passed_env())


class Toolbox:
    """Live MCP connections, one per server, shared by one or more runs (also at once). Nothing here
    belongs to one run: each run passes in its own restart budget."""

    def __init__(
        self,
        specs: list[ServerSpec],
        call_timeout_s: float = 300.0,
        max_result_chars: int = 100_000,
        errlog: IO[str] | None = None,
        max_restarts: int = 1,
        start_timeout_s: float = 60.0,
        secrets: list[str] | None = None,
        cache: ToolCache | None = None,
        flags: dict[str, Any] | None = None,
    ):
        self.specs = {spec.name: spec for spec in specs}
        self.flags = flags or {}
        """How the servers were asked for (`mcp`, `default_servers`), recorded so that a refused resume can
        show them to the user; URLs without their credentials."""
        self.call_timeout_s = call_timeout_s
        self.max_result_chars = max_result_chars
        self.errlog = errlog or sys.stderr
        self.max_restarts = max_restarts
        self.start_timeout_s = start_timeout_s
        # Keys are taken out of tool results before the model or the log can see them (>= 8 chars:
        # shorter strings would match ordinary text).
        self.secrets = usable_secrets(secrets)
        self.tools: list[dict[str, Any]] = []
        self._clients: dict[str, Client] = {}
        self._holders: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = {}  # each connection's task
        self._restarting: dict[str, asyncio.Lock] = {}  # one restart of a server at a time
        self._closed = False  # once closed, nothing restarts a server
        self._hung: dict[str, Client] = {}  # a connection whose server stopped answering, by server
        self._timeouts: dict[str, int] = {}  # calls in a row that timed out, by server
        self.cache = cache
        """Tool results recorded and served again (see cache.py); shared like the connections."""
        self._origins: dict[tuple[str, str], str] = {}  # (server, tool): where its results come from

    def settings(self) -> dict[str, Any]:
        """The settings that shape what the model reads, for the trajectory."""
        return {"max_result_chars": self.max_result_chars, "tool_timeout_s": self.call_timeout_s} | (
            {"tool_servers": self.flags} if self.flags else {}
        )

    async def __aenter__(self) -> Toolbox:
        try:  # all servers start at once; the tools keep the order the servers were given in
            listed = await asyncio.gather(*(self._connect(spec) for spec in self.specs.values()))
        except BaseException:
            await self.aclose()
            raise
        self.tools = [tool for tools in listed for tool in tools]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _connect(self, spec: ServerSpec) -> list[dict[str, Any]]:
        """Start (or reach) a server and list its tools, within `start_timeout_s`."""
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # read even when nobody waits any more
        close = asyncio.Event()
        self._holders[spec.name] = (asyncio.create_task(self._hold(spec, ready, close)), close)
        try:
            async with asyncio.timeout(self.start_timeout_s):
                self._clients[spec.name] = await asyncio.shield(ready)
                return await self._list_tools(spec.name)
        except BaseException as exc:  # a cancelled start too: no half-open connection stays behind
            await self._disconnect(spec.name)
            if not isinstance(exc, Exception):
                raise
            where = spec.url or (shlex.join(spec.command) if spec.command else "in-process")
            reason = f"no answer within {self.start_timeout_s:g} s" if isinstance(exc, TimeoutError) else _describe(exc)
            raise ToolboxError(
                f"MCP server {spec.name!r} ({where}) failed to start: {reason}",
                logged=bool(spec.command) and not spec.url and spec.server is None,
            ) from None

    async def _hold(self, spec: ServerSpec, ready: asyncio.Future[Client], close: asyncio.Event) -> None:
        """Open a connection and hold it until `close` is set. It lives in a task of its own because
        the SDK's connection must be closed by the task that opened it, and the run that restarts a
        server is not the one that stops the toolbox."""
        try:
            async with Client(spec.target(self.errlog)) as client:
                ready.set_result(client)
                await close.wait()
        except Exception as exc:  # failed to start, or died: callers see it through the client
            if not ready.done():
                ready.set_exception(exc)
        finally:
            if not ready.done():
                ready.set_exception(ConnectionError("the connection closed before it was ready"))

    async def _disconnect(self, server: str) -> None:
        client = self._clients.pop(server, None)
        task, close = self._holders.pop(server, (None, None))
        if task is None or close is None:
            return
        close.set()
        # a connection still starting is cut short; an open one gets time to close cleanly
        done, _ = await asyncio.wait({task}, timeout=10.0) if client is not None else (set(), set())
        if not done:  # a dead server may not close cleanly; there is nothing left to save
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _list_tools(self, server: str) -> list[dict[str, Any]]:
        client = self._clients[server]
        tools, cursor = [], None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools += [
                {"server": server, "name": t.name, "description": t.description or "", "input_schema": t.input_schema}
                for t in page.tools
            ]
            cursor = page.next_cursor
            if not cursor:
                break
        for tool in tools:
            self._origins[server, tool["name"]] = origin(client.server_info, tool)
        return tools

    async def _restart(self, server: str, dead: Client | None, restarts: Restarts) -> None:
        """Restart a server whose client `dead` failed, unless another run already did (then the new
        connection serves this run too and its budget is untouched)."""
        async with self._restarting.setdefault(server, asyncio.Lock()):
            if self._closed:
                raise ToolboxError("the toolbox is closed")
            if server in self._clients and self._clients[server] is not dead:
                return
            restarts.restarted(server)
            await self._disconnect(server)
            await self._connect(self.specs[server])

    def _unknown(self, call: ToolCall) -> str | None:
        if any(t["server"] == call.server and t["name"] == call.name for t in self.tools):
            return None
        available = ", ".join(f"{t['name']} (server {t['server']})" for t in self.tools) or "none"
        return f"Unknown tool: {call.name!r} on server {call.server!r}. Available tools: {available}."

    async def call(self, call: ToolCall, restarts: Restarts | None = None) -> ToolResult:
        """Run one tool call. Never raises for anything the model could fix or the server did.
        `restarts` is the calling run's own restart budget (a fresh one when None). With a
        cache in replay mode, a call it holds no result for raises `ReplayMiss`."""
        started = time.perf_counter()
        unknown = self._unknown(call)
        if unknown:
            return ToolResult(text=unknown, is_error=True)
        cached = None
        if self.cache is not None:  # its key holds no secret either: a model may quote a key in its arguments
            arguments = redact_values(call.arguments, self.secrets)
            where = self._origins.get((call.server, call.name), "")
            cached = await self.cache.lookup(call.server, call.name, arguments, where)
        if cached is not None:  # a cache hit costs nothing
            text, is_error, cost = *cached, None
        else:
            text, is_error, cost = await self._call_with_restart(call, Restarts() if restarts is None else restarts)
        answered = cached is None and not text.startswith(failure_prefix(call))  # not a timeout, nor a dead server
        text = defuse_control_tokens(redact(text, self.secrets))
        if self.cache is not None and answered:  # recorded before the cut, so that any result size limit can be served
            await self.cache.record(call.server, call.name, arguments, text, is_error, where)
        text, truncated = truncate(text, self.max_result_chars)
        return ToolResult(
            text=text,
            is_error=is_error,
            latency_s=time.perf_counter() - started,
            truncated=truncated,
            usage=cost,
            cached=cached is not None,
        )

    async def _call_with_restart(self, call: ToolCall, restarts: Restarts) -> tuple[str, bool, dict | None]:
        client = self._clients.get(call.server)
        if client is None:  # being restarted by another run: wait for it to finish
            async with self._restarting.setdefault(call.server, asyncio.Lock()):
                client = self._clients.get(call.server)
        # Failures read as the reference harness wrote them: "Tool call to T on S failed. Error: ..."
        failed = failure_prefix(call)
        timed_out = ""
        if client is not None and self._hung.get(call.server) is client:  # known to hang: not waited for again
            failure: BaseException = TimeoutError("not responding")
        else:
            try:
                answer = await self._call_once(call, client)
                self._timeouts[call.server] = 0
                restarts.answered_call(call.server)
                return answer
            except MCPError as exc:
                if exc.code == REQUEST_TIMEOUT:
                    timed_out = f"timed out after {self.call_timeout_s:g} s"
                    self._timeouts[call.server] = self._timeouts.get(call.server, 0) + 1
                    if self._timeouts[call.server] < HUNG_AFTER_TIMEOUTS and await self._responds(client):
                        return failed + timed_out + ".", True, None
                    self._hung[call.server], self._timeouts[call.server] = client, 0
                elif exc.code != CONNECTION_CLOSED:
                    self._timeouts[call.server] = 0
                    return failed + f"{exc}", True, None
                failure = exc
            except Exception as exc:  # the transport broke in some other way
                failure = exc
        return await self._after_failure(call, client, failure, timed_out, restarts)

    async def _after_failure(
        self, call: ToolCall, client: Client | None, failure: BaseException, timed_out: str, restarts: Restarts
    ) -> tuple[str, bool, None]:
        """The server died or hangs: restart it if this run's budget allows, and say what happened."""
        failed = failure_prefix(call) + (timed_out + "; " if timed_out else "")
        hung = client is not None and self._hung.get(call.server) is client
        spent = restarts.spent(call.server)
        if spent >= self.max_restarts and self._clients.get(call.server) is client:
            state = "is not responding" if hung else f"is not available ({_describe(failure)})"
            times = "once" if spent == 1 else f"{spent} times"
            return (
                failed
                + (
                    f"the server {state}; it was already restarted {times} in this run without answering "
                    f"{RESTART_CREDIT_CALLS} calls in between."
                ),
                True,
                None,
            )
        try:  # shielded: a run cancelled mid-restart must not leave the server half-started for the others
            await asyncio.shield(self._restart(call.server, client, restarts))
        except Exception as exc:
            return failed + f"the server stopped and could not be restarted: {_describe(exc)}", True, None
        # Not retried: the call may be what killed the server, and it may have had effects.
        what = (
            "the server stopped responding" if hung else f"the server stopped during this call ({_describe(failure)})"
        )
        return (
            (
                failed + f"{what} and was restarted; anything it held in memory is gone. "
                "Make the call again if you still need it."
            ),
            True,
            None,
        )

    async def _responds(self, client: Client | None) -> bool:
        """Whether the server still answers a request (listing its tools: every server answers that,
        and newer protocol versions have no ping): a call that timed out may just be slow."""
        if client is None:
            return False
        try:
            async with asyncio.timeout(min(PING_TIMEOUT_S, self.call_timeout_s)):
                await client.list_tools()
        except Exception:
            return False
        return True

    async def _call_once(self, call: ToolCall, client: Client | None) -> tuple[str, bool, dict | None]:
        if client is None:
            raise MCPError(CONNECTION_CLOSED, "not connected")
        try:  # the SDK's own timeout does not cover every transport (in-process), so bound it here too
            async with asyncio.timeout(self.call_timeout_s + 1.0):
                result = await client.call_tool(call.name, call.arguments, read_timeout_seconds=self.call_timeout_s)
        except TimeoutError:
            raise MCPError(REQUEST_TIMEOUT, "timed out") from None
        return result_text(result.content), bool(result.is_error), paid_usage(result.meta)

    async def aclose(self) -> None:
        self._closed = True
        for name in self.specs:
            async with self._restarting.setdefault(name, asyncio.Lock()):  # after a restart in flight
                await self._disconnect(name)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
