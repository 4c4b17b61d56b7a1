"""The script that runs a function-style program's tests inside its sandbox (`code_tests.py` writes it there as
`harness.py`, beside `solution.py`). Standard library only: it runs in the sandbox's interpreter, not in
nanbeige's.

    python -I -B harness.py ENTRY_POINT TIME_LIMIT_S          the judge's side: reads a nonce and the tests
    python -I -B harness.py --program ENTRY_POINT             the program's side, started by the first

The program never runs in the judge's process. The judge's side (this process, made non-dumpable so that
the program's process, of the same uid, cannot read its memory or descriptors) reads the nonce and the
tests (a JSON list) as two lines on its stdin, an unnamed file outside the sandbox's folders: no file the
program can open has them. Then it starts the program's side, which runs `solution.py` (its `__name__` is
`solution`, so a `__main__` block does not start) and answers calls of the entry point: a line `{"args":
"[...]", "kwargs": "{...}"}` in, a line `{"result": repr(value)}` or `{"error": "Type: message"}` out. The
judge's side times each call with its own clock and stops the program after TIME_LIMIT_S (then starts it
again for the next test). Results cross as Python literals, each value as its exact built-in type
(`plain`): an object whose `__eq__` says yes to everything arrives as its repr, which is no literal.

For each test it writes one JSON line on stdout, with the nonce: `{"i": 0, "s": seconds, "n": nonce, ...}` and
`"result": repr(value)` (a call test: the judge compares it with the expected value, which is never here),
`"ok": true` (an assert test ran to its end here, on the judge's side: `candidate` and the entry point's
name call the program; the test's own code defines whatever else it uses; the built-ins are Python's),
`"failed": "..."` (an assertion failed), `"error": "..."` or `"time-out": true`; then `{"done": nonce}`. A
program that cannot start gives `{"start": "...", "n": nonce}`.
"""

import ast
import builtins
import ctypes
import json
import numbers
import os
import select
import subprocess
import sys
import time

PR_SET_DUMPABLE = 4


class TimeLimit(Exception):
    """The program did not answer a call in time."""


class ProgramError(Exception):
    """The program raised, or could not answer."""


def short(exc):
    return f"{type(exc).__name__}: {exc}"[:300]


def numpy_scalar(value):
    """Whether the value is one of numpy's scalars (`numpy.generic`), told without importing numpy."""
    return any(kind.__name__ == "generic" and kind.__module__ == "numpy" for kind in type(value).__mro__)


def plain(value):
    """The value as its exact built-in type, inside containers too, so that its repr is a literal that reads back
    equal, as the value itself compares in a check: numpy's scalars through `.item()` (np.bool_ as bool,
    np.float64 as float), subclasses of int, float, complex, str, bytes, tuple (namedtuples), list, set and
    dict (an IntEnum, Counter, OrderedDict) as their base type, a frozenset as a set (it has no literal).
    Anything else is left as it is: its repr is no literal, and its test fails."""
    if type(value) in EXACT:
        return value
    if numpy_scalar(value):
        value = value.item()  # a Python value, but for longdouble's (itself: made a float below)
        if type(value) in EXACT:
            return value
    for base in (int, float, complex, str, bytes):  # bool has no subclasses
        if isinstance(value, base):
            return EXACT[base](value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, numbers.Complex):
        return complex(value)
    if isinstance(value, tuple):
        return tuple(plain(item) for item in value)
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return {plain(item) for item in value}
    if isinstance(value, dict):
        return {plain(key): plain(item) for key, item in dict.items(value)}
    return value


EXACT = {
    bool: bool,
    int: int.__int__,
    float: float.__float__,
    complex: complex,
    str: str.__str__,
    bytes: bytes,
    type(None): None,
}
"""The built-in scalar types, each with how a subclass's value is taken as it: the base's own conversion,
where it has one, so that a subclass's override is not asked."""


# ---------------------------------------------------------------- the program's side


def serve_program(entry):
    calls = os.fdopen(os.dup(0), "r", encoding="utf-8")
    answers = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    empty = os.open(os.devnull, os.O_RDONLY)
    os.dup2(empty, 0)
    os.dup2(2, 1)  # the program's prints go to stderr
    sys.stdin, sys.stdout = open(os.devnull, encoding="utf-8"), sys.stderr
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        with open("solution.py", encoding="utf-8") as source:
            exec(compile(source.read(), "solution.py", "exec"), namespace)
        namespace[entry]
    except BaseException as exc:
        answers.write(json.dumps({"start": short(exc)}) + "\n")
        return
    answers.write(json.dumps({"ready": True}) + "\n")
    for line in calls:
        try:
            call = json.loads(line)
            function = namespace[entry]
            value = function(*ast.literal_eval(call["args"]), **ast.literal_eval(call.get("kwargs", "{}")))
            answer = {"result": repr(plain(value))}
        except BaseException as exc:
            answer = {"error": short(exc)}
        answers.write(json.dumps(answer) + "\n")


# ---------------------------------------------------------------- the judge's side


class Program:
    """The program's process, started again after it ran out of time or died."""

    def __init__(self, entry, limit):
        self.entry, self.limit, self.process, self.buffer = entry, limit, None, b""

    def start(self):
        self.stop()
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-B", __file__, "--program", self.entry],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self.buffer = b""
        first = self.read(time.monotonic() + self.limit, "the program's top level ran past the time limit")
        if first != {"ready": True}:
            raise ProgramError(str(first.get("start", "the program's process sent something else than ready")))

    def read(self, deadline, late):
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([self.process.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                self.stop()
                raise TimeLimit(late)
            chunk = os.read(self.process.stdout.fileno(), 1 << 16)
            if not chunk:
                self.stop()
                raise ProgramError("the program's process ended")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            self.stop()
            raise ProgramError("the program's process sent something else than an answer")
        return answer

    def call(self, args, kwargs):
        """The repr of the result of calling the entry point; TimeLimit or ProgramError otherwise."""
        if self.process is None:
            self.start()
        request = json.dumps({"args": args, "kwargs": kwargs}) + "\n"
        try:
            self.process.stdin.write(request.encode())
            self.process.stdin.flush()
        except OSError:
            self.stop()
            raise ProgramError("the program's process ended") from None
        answer = self.read(time.monotonic() + self.limit, "ran past the time limit")
        if "error" in answer or not isinstance(answer.get("result"), str):
            raise ProgramError(str(answer.get("error", "no result")))
        return answer["result"]

    def stop(self):
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            for pipe in (self.process.stdin, self.process.stdout):
                pipe.close()
            self.process = None


def run_test(test, program):
    """One test's line, without its index, time and nonce. An assert test runs here, on trusted names only:
    the program's other functions, and any name of Python's it redefines (`abs`, `tuple`), never reach it."""
    if "assert" not in test:
        return {"result": program.call(test["args"], test.get("kwargs", "{}"))}

    def candidate(*args, **kwargs):
        return ast.literal_eval(program.call(repr(list(args)), repr(kwargs)))

    namespace = {"__builtins__": builtins, "__name__": "test", "candidate": candidate, program.entry: candidate}
    try:
        exec(compile(test["assert"], "test", "exec"), namespace)
    except AssertionError as exc:
        return {"failed": failed_assertion(exc, test["assert"])}
    return {"ok": True}


def failed_assertion(exc, source):
    """`AssertionError: message` and the test's line that failed (the innermost of the test's own code), so that
    a bare `assert` still says which check it was."""
    number, frame = None, exc.__traceback__
    while frame is not None:
        if frame.tb_frame.f_code.co_filename == "test":
            number = frame.tb_lineno
        frame = frame.tb_next
    lines = source.splitlines()
    where = f" at `{lines[number - 1].strip()}`" if number and 0 < number <= len(lines) else ""
    head = f"AssertionError: {exc}" if str(exc) else "AssertionError"
    return f"{head}{where}"[:300]


def main(entry, limit):
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    nonce = sys.stdin.readline().strip()
    tests = json.loads(sys.stdin.readline())
    sys.stdin.close()
    program = Program(entry, limit)
    try:
        program.start()
    except (TimeLimit, ProgramError) as exc:
        print(json.dumps({"start": str(exc), "n": nonce}), flush=True)
        return
    for index, test in enumerate(tests):
        started = time.perf_counter()
        try:
            line = run_test(test, program)
        except TimeLimit:
            line = {"time-out": True}
        except ProgramError as exc:
            line = {"error": str(exc)[:300]}
        except Exception as exc:  # the test's own code (an assert test's) failed
            line = {"error": short(exc)}
        line.update(i=index, s=time.perf_counter() - started, n=nonce)
        print(json.dumps(line), flush=True)
    program.stop()
    print(json.dumps({"done": nonce}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--program":
        serve_program(sys.argv[2])
    else:
        main(sys.argv[1], float(sys.argv[2]))
