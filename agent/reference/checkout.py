"""The reference harness's own texts, read at run time from the user's checkout of MiroThinker.

Nanbeige4.1-3B was trained and evaluated inside MiroThinker (`apps/miroflow-agent`). The model is
sensitive to the exact words of its prompts, and those words are not ours to copy, so with
`--reference PATH` every text the model sees in the mcp-xml dialect is read from the user's own
checkout instead of our paraphrases:

- `prompt_utils.py` imports nothing beyond the standard library, so its functions are run as they
  are (once its imports are checked to be the standard library's: the checkout's own dependencies
  need not be installed; this is no sandbox, the code runs with the user's rights, as it would in
  the reference itself): the system prompt (its MCP part and the main agent's objective, joined and stripped as the
  orchestrator does), and the summary prompt. Its malformed-call tags and refusal phrases are read
  too.
- `process_input` of `input_handler.py` (the user message) is run alone: its module imports
  document converters, which a task without a file never reaches.
- Everything else is read from the source without running it: the duplicate-query note (an
  f-string of the orchestrator; a checkout without it rolls a repeated query back instead, as the
  reference did from 2025-12-28) and the tools it covers; the tool descriptions (the docstrings of
  the three servers' tools, raw, as MCP SDK 1.x on Python 3.12 sent them); the page-extraction
  prompt; and the keep-5 agent's settings (YAML).

The commits this reader is tested against are in `SUPPORTED`; another commit is read the same way
and refused only when something cannot be found. Everything read is hashed: the hash and the
commit go into each trajectory's start record (`reference`), and eval reports carry them.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nanbeige.agent.reference.pieces import PIECES, compiled_docstring
from nanbeige.agent.reference.reader import FILES, PYTHONS, Reader, ReferenceError

__all__ = ["FILES", "PYTHONS", "Reference", "ReferenceError", "SUPPORTED", "compiled_docstring", "inspect", "load"]

# Commits whose layout and texts the tests pin (any other commit is read the same way).
SUPPORTED = {
    "f745722": "v1.0 (2025-11-13), the release the model card points to",
    "370f983": "2026-04-13, the newest commit read",
}


@dataclass(frozen=True)
class Reference:
    """What was read from one checkout."""

    path: Path
    commit: str | None
    """The checked-out commit (full hash), when the checkout is a git work tree."""
    sha256: str
    """Hash of every file read, so a trajectory says exactly which texts the model saw."""
    python: str
    """The Python whose docstrings the tool descriptions follow (PYTHONS)."""
    mcp_system_prompt: Callable[[datetime.date, list[dict[str, Any]]], str] = field(repr=False)
    agent_objective: str = field(repr=False)
    summary_prompt_function: Callable[..., str] = field(repr=False)
    process_input: Callable[..., tuple[str, str]] = field(repr=False)
    duplicate_query: str | None = field(repr=False)
    """The note a repeated query gets, with `{query}` and `{tool}`; None: a repeat is rolled back."""
    query_tools: tuple[str, ...] = field(repr=False)
    """Our tools whose repeated queries the note answers (`google_search`, and from 2025-12-02
    `scrape_and_extract_info`): those its query-string function names."""
    tool_descriptions: dict[tuple[str, str], str] = field(repr=False)
    extraction_prompt: str | None = field(repr=False)
    """The page-extraction prompt, a `str.format` template taking (info to extract, content)."""
    summary_tries: tuple[int, int] = (1, 1)
    """How many times the summary is asked for when a reply has no boxed answer: with all tool results
    kept (keep -1), and otherwise (1 and 1 in v1.0; 3 and 3 from 2025-12-28; 3 and 1 from 2026-01-09)."""
    mcp_tags: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()
    placeholder_ids: frozenset[str] = frozenset()
    """The made-up sandbox ids the reference's tool-python refuses."""
    placeholder_text: str | None = None
    """Its answer to one, after `[ERROR]: `, a `str.format` template with `{sandbox_id}`."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The keep-5 agent's settings: max_turns, keep_tool_result, temperature, top_p, max_tokens,
    max_context_length, repetition_penalty (those the checkout's YAML sets)."""
    judge_prompts: dict[str, str] = field(default_factory=dict, repr=False)
    """The evaluator's judge prompts by our judges' shared names (`browsecomp`, `hle`, `equivalent`, ...),
    `str.format` templates of question, correct_answer and response; empty without the evaluator."""

    def identity(self) -> dict[str, Any]:
        """What trajectories and reports record: `{commit, sha256, python}`."""
        return {"commit": self.commit, "sha256": self.sha256, "python": self.python}

    def system_prompt(self, tools: list[dict[str, Any]], date: str) -> str:
        """The system prompt for our tools, assembled as the orchestrator does: the MCP prompt plus
        the main agent's objective, stripped; each tool described by the reference's docstring
        where the reference has that tool."""
        from nanbeige.agent.reference.mcp_prompt import ordered_servers, reference_schema

        servers = [
            {
                "name": server,
                "tools": [
                    {
                        "name": tool["name"],
                        "description": self.tool_descriptions.get(
                            (server, tool["name"]), tool.get("description") or ""
                        ),
                        "schema": reference_schema(tool.get("input_schema") or {}),
                    }
                    for tool in tools
                    if tool["server"] == server
                ],
            }
            for server in ordered_servers(tools)
        ]
        day = datetime.date.fromisoformat(date)
        return (self.mcp_system_prompt(day, servers) + self.agent_objective).strip()

    def user_message(self, question: str) -> str:
        """The first user message, as the reference's `process_input` makes it of a task without a file."""
        return self.process_input(question, None)[0]

    def summary_attempts(self, keep_tool_results: int) -> int:
        return self.summary_tries[0] if keep_tool_results == -1 else self.summary_tries[1]

    def summary_prompt(self, question: str) -> str:
        return self.summary_prompt_function(question, agent_type="main")


def load(path: str | Path, python: str = "3.12") -> Reference:
    """Read a checkout; ReferenceError naming everything that could not be found. `python`: the
    Python the reference ran its servers on, "3.12" or "3.13", whose docstrings differ (see
    PYTHONS)."""
    report, reference = inspect(path, python)
    if reference is None:
        missing = [f"{name} ({detail})" for name, ok, detail in report if not ok]
        raise ReferenceError(
            f"--reference {path}: not a MiroThinker checkout this version can read: {'; '.join(missing)}"
        )
    return reference


def inspect(path: str | Path, python: str = "3.12") -> tuple[list[tuple[str, bool, str]], Reference | None]:
    """Each text and behaviour with whether the checkout was understood (name, ok, detail), and the
    Reference when everything was."""
    root = Path(path).expanduser()
    if python not in PYTHONS:
        return [("python", False, f"{python!r} is not one of {', '.join(PYTHONS)}")], None
    try:
        folder = root.is_dir()
    except OSError as exc:  # Python 3.11 raises for a folder it may not look into
        return [("checkout", False, f"cannot read {root}: {exc.strerror or exc}")], None
    if not folder:
        return [("checkout", False, f"{root} is not a folder")], None
    reader = Reader(root, python)
    report: list[tuple[str, bool, str]] = []
    found: dict[str, Any] = {}
    for name, read in PIECES:
        try:
            fields, detail = read(reader)
            found |= fields
            report.append((name, True, detail))
        except ReferenceError as exc:
            report.append((name, False, str(exc)))
    if not all(ok for _, ok, _ in report):
        return report, None
    commit = _commit(root)
    known = next((label for short, label in SUPPORTED.items() if commit and commit.startswith(short)), None)
    report.insert(
        0,
        (
            "commit",
            True,
            f"{commit or 'unknown (not a git checkout)'}"
            f"{': ' + known if known else ' (not one of the tested commits)'}",
        ),
    )
    reference = Reference(path=root, commit=commit, sha256=reader.digest(), python=python, **found)
    return report, reference


def _commit(root: Path) -> str | None:
    """The commit a git work tree has checked out, read from `.git` without running git."""
    git = root / ".git"
    try:
        if git.is_file():  # a worktree or submodule: `gitdir: PATH`
            git = (root / git.read_text().split(":", 1)[1].strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        if (git / ref).is_file():
            return (git / ref).read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except (OSError, IndexError, UnicodeDecodeError):  # not a readable git checkout: no commit to name
        return None
    return None
