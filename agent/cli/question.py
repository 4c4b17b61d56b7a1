"""Where the question comes from: the command line, stdin (`-`), or a file (`--question-file`), of
any length. Bytes that are not UTF-8 (a terminal in another encoding, a binary file) are replaced
with U+FFFD and the caller is told, so the run goes on and its trajectory can be written."""

from __future__ import annotations

import sys
from pathlib import Path

from nanbeige.tools.errors import NanbeigeError

INVALID_UTF8 = "the question is not valid UTF-8: the bytes that are not were replaced with \ufffd"


class QuestionError(NanbeigeError):
    """No usable question: the message says what to pass."""

    exit_code = 2  # a usage error: the question was not given, or not in a usable form


def read_question(argument: str | None, question_file: Path | None) -> tuple[str, str | None]:
    """The question, and a notice when undecodable bytes were replaced (else None)."""
    if (argument is None) == (question_file is None):
        raise QuestionError(
            "give the question as an argument, or `-` to read it from stdin, or --question-file PATH (one of them)"
        )
    if question_file is not None:
        try:
            data = question_file.read_bytes()
        except OSError as exc:
            raise QuestionError(f"cannot read --question-file {question_file}: {exc.strerror or exc}") from None
    elif argument == "-":
        data = sys.stdin.buffer.read()
    else:
        try:  # the command line's bytes that are not UTF-8 arrive as surrogate escapes: undo them
            data = argument.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            data = argument.encode("utf-8", "surrogatepass")
    try:
        text, notice = data.decode("utf-8-sig"), None
    except UnicodeDecodeError:
        text, notice = data.decode("utf-8-sig", "replace"), INVALID_UTF8
    text = text.strip()
    if not text:
        raise QuestionError("the question is empty")
    return text, notice
