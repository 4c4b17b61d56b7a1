"""The script that runs a function-style program's tests inside its sandbox (`code_tests.py` writes it there as
`harness.py`, beside `solution.py` and `tests.json`). Standard library only: it runs in the sandbox's
interpreter, not in nanbeige's.

    python -I -B harness.py ENTRY_POINT TIME_LIMIT_S

It reads a nonce from stdin, runs the program (its `__name__` is `solution`, so a `__main__` block does not
start), then each test with TIME_LIMIT_S of wall-clock time, and writes one JSON line per test on stdout,
which carries nothing else (the program's own prints go to stderr), then `{"done": nonce}` after the last:
`{"i": 0, "s": seconds, "n": nonce, ...}` with `"result": repr(value)`
(a call test: the judge compares it with the expected value, which is never here), `"ok": true` (an
assert test ran to its end), `"error": "Type: message"`, `"failed": "..."` (an assertion failed) or
`"time-out": true`. A program that cannot start gives one line, `{"start": "...", "n": nonce}`. The nonce
keeps a program from passing an assert test by writing `"ok"` lines itself and ending the process: it would
have to find the nonce in this process's memory first (an assert test runs in the program's interpreter).
"""

import ast
import json
import os
import signal
import sys
import time


class TimeLimit(BaseException):
    """Raised by the alarm: a BaseException, so that a test's `except Exception` does not swallow it."""


def alarm(signum, frame):
    raise TimeLimit()


def short(exc):
    return f"{type(exc).__name__}: {exc}"[:300]


def run_test(test, candidate, namespace):
    """One test's line, without its index and time."""
    if "assert" in test:
        try:
            exec(compile(test["assert"], "test", "exec"), {**namespace, "candidate": candidate})
        except AssertionError as exc:
            return {"failed": short(exc)}
        return {"ok": True}
    args = ast.literal_eval(test["args"])
    kwargs = ast.literal_eval(test.get("kwargs", "{}"))
    return {"result": repr(candidate(*args, **kwargs))}


def main(entry, limit):
    # The nonce arrives on stdin, read before the program runs, which then gets an empty stdin: a result line
    # without it is not ours (the program could write to the report's descriptor).
    nonce = sys.stdin.readline().strip()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(os.devnull, encoding="utf-8")
    with open("tests.json", encoding="utf-8") as given:
        tests = json.load(given)
    report = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    signal.signal(signal.SIGALRM, alarm)
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        with open("solution.py", encoding="utf-8") as source:
            code = compile(source.read(), "solution.py", "exec")
        signal.setitimer(signal.ITIMER_REAL, limit)  # its top level gets one test's time
        exec(code, namespace)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except TimeLimit:
        report.write(json.dumps({"start": f"the program's top level ran past {limit:g} s", "n": nonce}) + "\n")
        return
    except BaseException as exc:
        signal.setitimer(signal.ITIMER_REAL, 0)
        report.write(json.dumps({"start": short(exc), "n": nonce}) + "\n")
        return
    candidate = namespace.get(entry)
    for index, test in enumerate(tests):
        started = time.perf_counter()
        try:
            signal.setitimer(signal.ITIMER_REAL, limit)
            line = run_test(test, candidate, namespace)
            signal.setitimer(signal.ITIMER_REAL, 0)
        except TimeLimit:
            line = {"time-out": True}
        except BaseException as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            line = {"error": short(exc)}
        line.update(i=index, s=time.perf_counter() - started, n=nonce)
        try:
            report.write(json.dumps(line) + "\n")
        except (ValueError, TypeError):  # a result whose repr is not text (a broken __repr__)
            report.write(json.dumps({"i": index, "error": "the result's repr is not text", "n": nonce}) + "\n")
    report.write(json.dumps({"done": nonce}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
