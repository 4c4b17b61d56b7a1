"""The process inside a local sandbox (see `local.py`); standard library only, because it runs
in an isolated interpreter that must start fast.

    python -I -B worker.py LIMITS python REQUEST_FD REPLY_FD CPU_SECONDS MAX_BYTES [OWN_UID]
    python -I -S -B worker.py LIMITS exec STATUS_FD PROGRAM [ARG ...]

LIMITS is `AS=bytes,FSIZE=bytes,...` (RLIMIT_ names without the prefix). The worker first applies
them to itself (soft = hard, so sandboxed code cannot raise them), then either serves Python cells
like a notebook kernel, one JSON line per request and per reply (the reply echoes the request's
`id`; only this process ever replies, never one a cell forked), keeping one namespace across
cells, or runs PROGRAM (a shell command) and writes to STATUS_FD (-1: nowhere) `run` as it starts
it, then how it ended.
OWN_UID is 1 when the sandbox runs as a uid of its own (nothing else runs as it).

Either way it ends, with everything it started, as soon as the server is gone (`watch_server`).

Modules beyond the first four are imported where they are used: the `exec` path runs once per
shell command and should cost little more than the interpreter's start.
"""

from __future__ import annotations

import io
import os
import resource
import select
import signal
import sys
from contextlib import suppress

MAX_TRACEBACK_CHARS = 4_000
SERVING_PID = 0  # the process that serves cells; a process forked by a cell has another pid
PROCESS_EVENTS = frozenset(
    {"os.fork", "os.forkpty", "os.system", "os.posix_spawn", "os.spawn", "os.exec", "subprocess.Popen"}
)
PROCESS_STARTED = False
CELL_CPU_END: float | None = None  # the CPU time at which the running cell has used its budget; None between cells
CPU_TICK_SLACK_S = 0.1  # how far the kernel's tick-based count may run ahead of getrusage's
# In a jail (jail.py shows this file there) the process is in a pid namespace of its own,
# where kill(-1) reaches only the sandbox's processes.
JAILED = __file__ == "/run/sandbox/worker.py"


def apply_limits(limits: str) -> None:
    for item in filter(None, limits.split(",")):
        name, value = item.split("=")
        # a second of grace past the CPU limit turns SIGKILL into the more telling SIGXCPU
        hard = int(value) + 1 if name == "CPU" else int(value)
        resource.setrlimit(getattr(resource, f"RLIMIT_{name}"), (int(value), hard))


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class CappedRaw(io.RawIOBase):
    """Writes straight to a file descriptor until a byte budget is spent, then drops the rest,
    so a flood of prints costs neither memory nor disk."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.left = 0

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def write(self, data: bytes) -> int:  # type: ignore[override]
        write_all(self.fd, memoryview(data)[: max(self.left, 0)])
        self.left -= len(data)
        return len(data)


def text_stream(raw: CappedRaw) -> io.TextIOWrapper:
    # write_through keeps our prints in order with the output of child processes on the same fd
    return io.TextIOWrapper(
        raw,
        encoding="utf-8",
        errors="backslashreplace",  # type: ignore[arg-type]
        write_through=True,
    )


def run_code(code: str, namespace: dict, filename: str, results: list[str], max_chars: int) -> None:
    """Executes a cell; the value of a final expression becomes a result, as in a notebook."""
    import ast
    import linecache

    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(code, filename, "exec", flags | ast.PyCF_ONLY_AST)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    evaluate(compile(tree, filename, "exec", flags), namespace)
    if last is not None:
        value = evaluate(compile(ast.Expression(last.value), filename, "eval", flags), namespace)
        if value is not None:
            namespace["_"] = value
            results.append(repr(value)[:max_chars])


def evaluate(code: object, namespace: dict) -> object:
    value = eval(code, namespace)  # noqa: S307 - running the model's code is the point
    if code.co_flags & 0x80:  # CO_COROUTINE: the cell used top-level await
        import asyncio

        value = asyncio.run(value)
    return value


def describe_error(exc: BaseException) -> dict[str, str]:
    import traceback

    try:
        report = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        # the worker's own frames mean nothing to the model
        report.stack = traceback.StackSummary.from_list([f for f in report.stack if f.filename != __file__])
        text, value = "".join(report.format()), str(exc)
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails
        text, value = "", "<unprintable>"
    if len(text) > MAX_TRACEBACK_CHARS:
        text = "...\n" + text[-MAX_TRACEBACK_CHARS:]
    return {"name": type(exc).__name__, "value": value[:MAX_TRACEBACK_CHARS], "traceback": text}


def new_capture(fd: int, folder: str) -> None:
    """Points fd (1 or 2) at a new unnamed file in folder, so that `os.system` output is captured too."""
    import tempfile

    capture = tempfile.TemporaryFile(dir=folder)
    os.dup2(capture.fileno(), fd)
    capture.close()


def read_capture(fd: int, max_bytes: int, folder: str) -> str:
    """What the cell wrote to fd. A cell that started processes leaves them its file and the next
    cell gets a new one (about 0.1 ms each), so what they write later reaches no other cell's output."""
    global PROCESS_STARTED

    data = os.pread(fd, max_bytes, 0)
    try:
        if PROCESS_STARTED:
            new_capture(fd, folder)
            return data.decode("utf-8", errors="replace")
    except OSError:  # the code made its folder unwritable: keep the file
        pass
    finally:
        PROCESS_STARTED = False
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    return data.decode("utf-8", errors="replace")


def note_process_start(event: str, args: tuple) -> None:
    """An audit hook: notes that the cell started a process (which may outlive it)."""
    global PROCESS_STARTED

    if event in PROCESS_EVENTS:
        PROCESS_STARTED = True


def set_cpu_limit(soft: int) -> None:
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]  # infinite, unless the code lowered it
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def cpu_used() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def cpu_exceeded(signum: int, frame: object) -> None:
    # A SIGXCPU can reach Python after the cell that earned it (or come from outside); one that comes
    # between cells, or before this cell has used its budget, is left alone: a cell that does run on
    # gets the kernel's next one a second later, and the server's watch over /proc stays the backstop.
    if CELL_CPU_END is not None and cpu_used() >= CELL_CPU_END - CPU_TICK_SLACK_S:
        raise TimeoutError("CPU time limit for this call exceeded")


def reap_children() -> None:
    # children the server killed after a cell would otherwise stay zombies of this process, and
    # count against the process limit
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def send(fd: int, message: dict) -> None:
    """One JSON line to the server; never from a process a cell forked (it ends instead), so
    replies cannot come twice or out of turn."""
    import json

    if os.getpid() != SERVING_PID:
        os._exit(0)
    write_all(fd, json.dumps(message).encode() + b"\n")


def end_forked_child(exc: BaseException | None) -> None:
    """Ends a process that a cell forked, once it has run the rest of the cell, the way a script
    ends: the loop that serves cells belongs to the worker alone."""
    code = 0
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    elif exc is not None:
        import traceback

        with suppress(Exception):
            traceback.print_exception(exc)
        code = 1
    with suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code & 0xFF)


def close_channel_in_child(*fds: int) -> None:
    """Runs in every process forked from the worker: a child has no business with the pipes to the
    server, so it loses them before the cell's code goes on in it."""
    for fd in fds:
        with suppress(OSError):
            os.close(fd)


def run_cell(
    code: str,
    namespace: dict,
    cell: int,
    captures: tuple[CappedRaw, CappedRaw],
    cpu_seconds: int,
    max_bytes: int,
    folder: str,
) -> dict:
    results: list[str] = []
    namespace["display"] = lambda *values: results.extend(repr(v)[:max_bytes] for v in values)
    for capture in captures:
        capture.left = max_bytes
    global CELL_CPU_END
    CELL_CPU_END = cpu_used() + cpu_seconds
    set_cpu_limit(-int(-CELL_CPU_END))  # rounded up: at least cpu_seconds
    error, raised = None, None
    try:
        run_code(code, namespace, f"<cell {cell}>", results, max_bytes)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are the cell's errors too
        raised = exc
    if os.getpid() != SERVING_PID:  # a process the cell forked, at the end of the cell
        end_forked_child(raised)
    # between calls the server watches the CPU time; a SIGXCPU then would end this process
    set_cpu_limit(resource.RLIM_INFINITY)
    CELL_CPU_END = None
    if raised is not None:
        error = describe_error(raised)
    return {
        "results": results,
        "stdout": read_capture(1, max_bytes, folder),
        "stderr": read_capture(2, max_bytes, folder),
        "error": error,
    }


def watch_server(fd: int, kill_all: bool) -> None:
    """Ends this process and everything it started once the server is gone, even killed outright:
    the server holds the other end of the pipe `fd`, which the kernel closes when it dies. Without
    this, a cell or command would run on until it ends by itself, or forever. The watching is a
    thread of its own because the main thread is busy running the model's code."""
    import threading

    def watch() -> None:
        poller = select.poll()
        poller.register(fd, 0)  # only hang-up and error: the pipe's data belongs to the main thread
        poller.poll()
        if kill_all:  # every process of this sandbox's uid or jail, also those that left this process group
            with suppress(OSError):
                os.kill(-1, signal.SIGKILL)
        with suppress(OSError):
            os.killpg(0, signal.SIGKILL)
        os._exit(137)

    threading.Thread(target=watch, name="server-watch", daemon=True).start()


def serve(request_fd: int, reply_fd: int, cpu_seconds: int, max_bytes: int, own_uid: int = 0) -> None:
    import builtins
    import json

    global SERVING_PID
    SERVING_PID = os.getpid()
    os.register_at_fork(after_in_child=lambda: close_channel_in_child(request_fd, reply_fd))
    sys.addaudithook(note_process_start)
    watch_server(request_fd, bool(own_uid) or JAILED)
    os.set_inheritable(request_fd, False)
    os.set_inheritable(reply_fd, False)
    folder = os.getcwd()
    for fd in (1, 2):
        new_capture(fd, folder)
    captures = CappedRaw(1), CappedRaw(2)
    streams = text_stream(captures[0]), text_stream(captures[1])
    signal.signal(signal.SIGXCPU, cpu_exceeded)
    namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
    # /proc/self names this process as the server sees it, even inside a pid namespace
    send(reply_fd, {"pid": int(os.readlink("/proc/self")) if os.path.exists("/proc/self") else os.getpid()})
    cell = 0
    for line in os.fdopen(request_fd, "rb"):
        request = json.loads(line)
        reap_children()
        if "code" not in request:  # the server asks for the reaping alone
            send(reply_fd, {"id": request["id"]})
            continue
        cell += 1
        sys.stdout, sys.stderr = streams  # in case the previous cell replaced them
        sys.stdin = io.StringIO()
        reply = run_cell(request["code"], namespace, cell, captures, cpu_seconds, max_bytes, folder)
        send(reply_fd, {"id": request["id"], **reply})


def run_program(status_fd: int, args: list[str]) -> int:
    """Runs args as a child and reports how it ended, `exit N` or `signal N`, on status_fd. In a
    pid namespace this process is its init (the reaper of orphans there), and unshare, the parent,
    cannot pass a death by signal on."""
    if status_fd >= 0:
        os.set_inheritable(status_fd, False)
        # outside a jail, the command's processes share this process group (other processes of the
        # uid may be the worker's)
        watch_server(status_fd, kill_all=JAILED)
        # the jail and this process work: said before the program exists, so that it cannot unsay it
        os.write(status_fd, b"run\n")
    try:
        child = os.fork()
    except OSError as exc:
        print(f"sandbox: cannot start {args[0]}: {exc}", file=sys.stderr)
        return 126
    if child == 0:
        # Python ignores these two signals; a shell command should get the usual behaviour back
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        try:
            os.execvp(args[0], args)
        finally:
            os._exit(127)
    while (ended := os.wait())[0] != child:
        pass
    code = os.waitstatus_to_exitcode(ended[1])
    if status_fd >= 0:
        os.write(status_fd, (f"signal {-code}" if code < 0 else f"exit {code}").encode())
    return code if code >= 0 else 128 - code


def main(argv: list[str]) -> None:
    apply_limits(argv[1])
    if argv[2] == "python":
        serve(*map(int, argv[3:8]))  # type: ignore[arg-type]
    else:
        sys.exit(run_program(int(argv[3]), argv[4:]))


if __name__ == "__main__":
    main(sys.argv)
