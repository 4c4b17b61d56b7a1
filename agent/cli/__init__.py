"""The command line: the `nanbeige` program (`program.py`) and its commands, the only code that uses the
runtime (`nanbeige.agent`), evals and the trainer together. `app` and `main` are read from `program` when
first asked for, so that the entry point sets the process up before anything heavy is imported."""

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("app", "main"):
        from nanbeige.agent.cli import program

        return getattr(program, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
