"""A command's work in shards on Ray actors, one per node, when one machine is not enough (`--ray`).

The only module that imports Ray, and only `--ray` imports it (an import rule and a test keep it so).
The command's own process (the driver) keeps the queue of work items and stays the only writer of the
output files: each actor opens on its node what the items need (tool servers, model clients, through the
same setup as any command), runs the items the driver hands it, and sends each result back, the records
of a run's trajectory included, for the driver to write through the command's usual writer. So the files,
their formats and their resume rules are those of a run in one process.

An actor lost with its node (or killed) loses only its items in flight: none of them was written, and each
goes to another actor. An actor that cannot open what its items need stops the command, naming its node.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import ActorUnschedulableError, ObjectLostError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from nanbeige.agent.toolbox.server_env import passed_env
from nanbeige.agent.trajectory.trajectory import Trajectory, Turn
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter
from nanbeige.tools.errors import NanbeigeError

if TYPE_CHECKING:
    from nanbeige.agent.run.run_config import RunSettings

Notice = Callable[[str], None]
Work = Callable[[Any], Awaitable[Any]]
Opener = Callable[[Notice], AbstractAsyncContextManager[Work]]
Check = Callable[[Any, Any], "str | None"]
"""What is wrong with a shard's result for an item (the item, the result), or None."""
"""Opens, on an actor, what a shard's items need and yields the function that runs one item; its notices
(a search backend missing, ...) go to the driver."""

START_TIMEOUT_S = 300.0
"""How long an actor may take to open its shard (tool servers, a model server's answer, a model loaded)."""
MAX_CALLS = 10_000
"""Calls an actor takes at once: every item sent to it (they wait for its slots inside) and `close`."""
CLOSE_TIMEOUT_S = 30.0
"""How long closing the shards may take (tool servers stopped) before their actors are killed."""


class ClusterError(NanbeigeError):
    """The Ray cluster cannot run the command's shards; one line naming the fix (and the node)."""


# ---------------------------------------------------------------- the records of a run, carried to the driver


class Recorder:
    """The trajectory writer of a run on an actor: it keeps what the loop writes, in order, for the driver to
    write. Each start and turn is copied when logged, as a file would hold it then."""

    def __init__(self, secrets: list[str]):
        self.secrets = secrets
        self.path = Path(os.devnull)
        self.whole = False
        self.error: str | None = None
        self.calls: list[tuple[str, Any]] = []

    def start(self, trajectory: Trajectory) -> None:
        self.calls.append(("start", copy.deepcopy(trajectory)))

    def turn(self, trajectory: Trajectory, turn: Turn) -> None:
        self.calls.append(("turn", copy.deepcopy(turn)))

    def end(self, trajectory: Trajectory) -> None:
        self.calls.append(("end", trajectory))  # the loop is done with it: no copy

    def write(self, record: dict[str, Any]) -> None:
        self.calls.append(("record", record))

    def close(self) -> None:
        pass


def replay(calls: list[tuple[str, Any]], writer: TrajectoryWriter) -> None:
    """Write a run's records through the driver's writer, as the run's own writer would have: in whole mode
    a trajectory that did not end on its own is left out. No await here: runs never interleave lines."""
    started: Trajectory | None = None
    for kind, value in calls:
        if kind == "start":
            started = value
            writer.start(value)
        elif kind == "turn" and started is not None:
            writer.turn(started, value)
        elif kind == "end":
            writer.end(value)
        elif kind == "record":
            writer.write(value)


# ---------------------------------------------------------------- the actor


class Shard:
    """One node's shard (a Ray actor): what the opener opened, held open in a task of its own (tool servers
    are closed by the task that opened them), and the items the driver sends through it."""

    def __init__(self, opener: Opener, concurrency: int, env: dict[str, str], cwd: str):
        os.environ.update(env)  # the driver's keys and settings, for the tool servers started here
        if os.path.isdir(cwd):  # relative paths mean what they meant to the driver (a shared file system)
            os.chdir(cwd)
        self.opener = opener
        self.notices: list[str] = []
        self.work: Work | None = None
        self.stop = asyncio.Event()
        self.life: asyncio.Task[None] | None = None
        self.running: set[asyncio.Task[Any]] = set()
        # Items beyond it wait here, not in Ray's queue, so that `close` always gets in (after a node is lost
        # the others get more than their share). One event loop: Ray's concurrency groups would each get one.
        self.slots = asyncio.Semaphore(concurrency)

    async def start(self) -> tuple[bool, Any]:
        """(True, the notices) once the shard is open, or (False, why it could not open)."""
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.life = asyncio.create_task(self._hold(opened))
        try:
            await opened
        except Exception as exc:  # noqa: BLE001 - said to the driver, which stops the command
            own = type(exc).__module__.startswith("nanbeige")  # our errors are one line that names the fix
            return False, (str(exc) if own and str(exc) else f"{type(exc).__name__}: {exc}")
        return True, self.notices

    async def _hold(self, opened: asyncio.Future[None]) -> None:
        try:
            async with self.opener(self.notices.append) as work:
                self.work = work
                opened.set_result(None)
                await self.stop.wait()
        except BaseException as exc:
            if opened.done():
                raise
            opened.set_exception(exc)

    async def run(self, item: Any) -> tuple[str, Any]:
        """("done", the item's result), or ("raised", the exception that stops the command)."""
        task = asyncio.current_task()
        assert task is not None and self.work is not None
        self.running.add(task)
        try:
            async with self.slots:
                return "done", await self.work(item)
        except Exception as exc:  # noqa: BLE001 - raised again on the driver
            return "raised", exc
        finally:
            self.running.discard(task)

    async def close(self) -> None:
        for task in list(self.running):
            task.cancel()
        self.stop.set()
        if self.life is not None:
            await asyncio.gather(self.life, return_exceptions=True)


# ---------------------------------------------------------------- the driver


def connect(address: str) -> None:
    """Join the Ray cluster at `address` (`auto`: the one this machine is part of, `ray start`'s)."""
    import logging

    if address != "auto":
        check_answers(address)
    try:
        ray.init(
            address=address,
            logging_level=logging.WARNING,
            log_to_driver=False,
            configure_logging=True,
            namespace="nanbeige",
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        fix = (
            "start one with `ray start --head`, or pass its address (HOST:PORT)"
            if address == "auto"
            else "check the address (`ray status` on the head node prints it)"
        )
        said = first_line(exc).rstrip(".")
        raise ClusterError(f"cannot join the Ray cluster at {address}: {said}; {fix}") from None


def check_answers(address: str) -> None:
    """A Ray address that does not answer is refused in seconds (Ray itself would retry for a minute)."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or not host:
        raise ClusterError(f"--ray takes auto or HOST:PORT (the head node's address), not {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5.0).close()
    except OSError as exc:
        raise ClusterError(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}); start one with "
            "`ray start --head` there, or pass another --ray"
        ) from None


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


@dataclass
class Placed:
    """An actor of the driver's and what the driver knows of it."""

    actor: Any
    node: str
    """How messages name its node: its address and the start of its id."""
    in_flight: int = 0
    lost: bool = False


class Shards:
    """The driver's side: one actor per node with a CPU, each item sent to the actor with the fewest in
    flight, an item whose actor is lost sent again to another."""

    def __init__(self, placed: list[Placed], notice: Notice):
        self.placed = placed
        self.notice = notice

    @property
    def alive(self) -> list[Placed]:
        return [p for p in self.placed if not p.lost]

    async def run(self, item: Any, check: Check | None = None) -> Any:
        """The item's result, from whichever actor finishes it; an exception it raised is raised here. `check`
        says what is wrong with a result for the item (`agent/trajectory/shard_results.py`): such a result fails
        the shard and the command, and nothing of it is written."""
        while True:
            live = self.alive
            if not live:
                raise ClusterError(
                    "every node running the shards was lost; run the same command again to go on with what is not done"
                )
            placed = min(live, key=lambda p: p.in_flight)
            placed.in_flight += 1
            try:
                result = await placed.actor.run.remote(item)
            except (RayActorError, ObjectLostError) as exc:  # its node is gone, with the result if it had one
                self.lose(placed, exc)
                continue
            finally:
                placed.in_flight -= 1
            status, value = result if type(result) is tuple and len(result) == 2 else (None, result)
            if status == "raised" and isinstance(value, Exception):
                raise value
            problem = None if status == "done" else "neither a result nor an exception it raised"
            problem = problem or (check(item, value) if check is not None else None)
            if problem:
                raise ClusterError(
                    f"the shard on {placed.node} failed: what it sent back does not fit the item it was given "
                    f"({problem}); nothing of it was written"
                )
            return value

    def lose(self, placed: Placed, exc: BaseException) -> None:
        if placed.lost:
            return
        placed.lost = True
        with contextlib.suppress(Exception):  # one only unreachable for now must not go on with its items
            ray.kill(placed.actor, no_restart=True)
        self.notice(
            f"lost the shard on {placed.node} ({first_line(exc)}): its runs in flight go to the other "
            f"nodes ({len(self.alive)} left)"
        )


def worker_nodes() -> list[dict[str, Any]]:
    """The alive nodes that offer a CPU (a head started with `--num-cpus 0` runs no shard)."""
    return [node for node in ray.nodes() if node.get("Alive") and node.get("Resources", {}).get("CPU", 0) >= 1]


def node_name(node: dict[str, Any]) -> str:
    return f"node {node.get('NodeManagerAddress', '?')} ({node['NodeID'][:8]})"


@asynccontextmanager
async def shards(address: str, opener: Opener, concurrency: int, notice: Notice) -> AsyncIterator[Shards]:
    """Join the cluster, start a shard on every node with a CPU (each running up to `concurrency` items at
    once) and yield them; close them all after. A shard that cannot start stops it all, naming its node."""
    connect(address)
    try:
        nodes = worker_nodes()
        if not nodes:
            raise ClusterError(f"the Ray cluster at {address} has no node with a CPU to run shards on")
        actor_class = ray.remote(num_cpus=1, max_concurrency=MAX_CALLS)(Shard)
        placed = [
            Placed(
                actor_class.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
                ).remote(opener, concurrency, passed_env(with_secrets=True), os.getcwd()),
                node_name(node),
            )
            for node in nodes
        ]
        try:
            await start_all(placed, notice)
            yield Shards(placed, notice)
        finally:
            await close_all(placed)
    finally:
        ray.shutdown()


async def start_all(placed: list[Placed], notice: Notice) -> None:
    calls = {asyncio.ensure_future(p.actor.start.remote()): p for p in placed}
    _, late = await asyncio.wait(calls, timeout=START_TIMEOUT_S)
    for call in late:
        call.cancel()
    # every answer read before any is acted on: none is left unretrieved
    results = [(where, call.exception() or call.result()) for call, where in calls.items() if call not in late]
    if late:
        raise ClusterError(
            f"the shard on {calls[next(iter(late))].node} did not start within {START_TIMEOUT_S:g} s "
            "(its tool servers or its model server?)"
        )
    said: set[str] = set()
    for where, result in results:
        if isinstance(result, (RayActorError, ActorUnschedulableError)):
            raise ClusterError(
                f"the shard on {where.node} did not start ({first_line(result)}); is nanbeige "
                "installed in the same Python environment on every node?"
            )
        if isinstance(result, BaseException):
            raise ClusterError(f"the shard on {where.node} did not start: {first_line(result)}")
        ok, value = result
        if not ok:
            raise ClusterError(f"{where.node}: {value}")
        for line in value:
            if line not in said:  # every node says the same: once is enough
                said.add(line)
                notice(line)
    notice(f"running on {len(placed)} Ray node{'s' * (len(placed) != 1)}")


async def close_all(placed: list[Placed]) -> None:
    """Close every shard (its runs in flight cancelled, its tool servers stopped), then end the actors."""
    live = [p for p in placed if not p.lost]
    try:
        await asyncio.wait_for(
            asyncio.gather(*(p.actor.close.remote() for p in live), return_exceptions=True), CLOSE_TIMEOUT_S
        )
    except (TimeoutError, asyncio.CancelledError):
        pass
    for p in placed:
        with contextlib.suppress(Exception):  # gone already
            ray.kill(p.actor, no_restart=True)


# ---------------------------------------------------------------- what a shard of runs opens on its node


@asynccontextmanager
async def shard_runtime(settings: RunSettings, notice: Notice) -> AsyncIterator[Any]:
    """`ready` on an actor: the model clients and tool servers of the node's runs. Its own trajectory file
    stays empty (the records go to the driver); it and the tool servers' log are in a folder of the node's
    own, removed after, unless a tool server that failed to start left its output there."""
    import dataclasses
    import shutil
    import tempfile

    from nanbeige.agent.setup.setup import ready

    folder = Path(tempfile.mkdtemp(prefix="nanbeige-shard-"))
    try:
        async with ready(dataclasses.replace(settings, trajectory=folder / "shard.jsonl"), notice) as runtime:
            yield runtime
    except BaseException:
        if not any(path.stat().st_size for path in folder.iterdir()):  # nothing to read there
            shutil.rmtree(folder, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)


def recorded(runtime: Any, attempt_of: Callable[[Any], Callable[..., Awaitable[Any]]]) -> Work:
    """The work of a shard of runs: each item (its arguments) run by the attempt made for it with its own
    `Recorder` as the writer; the result is the attempt's and the run's records, for `replay`."""
    import dataclasses

    async def work(item: tuple[Any, ...]) -> tuple[Any, list[tuple[str, Any]]]:
        recorder = Recorder(runtime.writer.secrets)
        result = await attempt_of(dataclasses.replace(runtime, writer=recorder))(*item)
        return result, recorder.calls

    return work
