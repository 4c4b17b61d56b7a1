"""LiveCodeBench's private tests, read from how its release packs them: base64 of zlib of a pickle of the JSON
text of a list of test cases. A row is handed over, so every cap applies while it is read, never after:

- Decompression goes a piece (1 MiB) at a time and stops at `MAX_DECOMPRESSED`: a small row that inflates
  to hundreds of MiB is refused without ever being whole in memory.
- The pickle is never unpickled (that runs whatever it names). Its opcodes are read one by one and accepted
  only when they hold one text and nothing else (protocol marks, frames, memo entries); the text's bytes go
  straight on to the JSON reader. The binary text opcodes of protocols 2 to 5 are the ones read: the release
  was written by Python 3's `pickle.dumps`, which uses them.
- The JSON list is read case by case as its text arrives, counted as it goes: the case past the most a
  problem may have (`code_problems.MAX_TESTS`, less its public tests) refuses the row there, and so does
  one case longer than `MAX_CASE_CHARS`.

So what reading one row holds at a time is about one case and one piece, whatever the row inflates to.
"""

from __future__ import annotations

import codecs
import json
import pickletools
import re
import struct
import zlib
from collections.abc import Iterator
from typing import Any

from nanbeige.evals.code_problems import MAX_TESTS
from nanbeige.evals.tasks import LoadError

MAX_DECOMPRESSED = 256 << 20
"""The most LiveCodeBench's private tests of one problem may decompress to (the largest released are far less)."""
MAX_CASE_CHARS = 32 << 20
"""The longest one test case's JSON text may be (a stdin input of a few MB is already a large one)."""
PIECE = 1 << 20
OPCODE_NAMES = {op.code.encode("latin-1"): op.name for op in pickletools.opcodes}
FRAMING = {"PROTO": 1, "FRAME": 8, "MEMOIZE": 0, "BINPUT": 1, "LONG_BINPUT": 4}
"""The opcodes that only frame or memoize, with the bytes of argument each takes."""
TEXT_LENGTH = {"SHORT_BINUNICODE": "<B", "BINUNICODE": "<I", "BINUNICODE8": "<Q"}
"""The opcodes that hold a text, with how its length is written before it."""
SPACE = re.compile(r"[ \t\n\r]*")
FIELD = "`private_test_cases`"


class Inflating:
    """The bytes a zlib stream decompresses to, read a piece at a time; `LoadError` past MAX_DECOMPRESSED."""

    def __init__(self, packed: bytes, where: str):
        self.unpacker = zlib.decompressobj()
        self.pending = packed
        self.buffer = b""
        self.total = 0
        self.where = where

    def read(self, size: int) -> bytes:
        """Up to `size` bytes; fewer only where the stream ends."""
        while len(self.buffer) < size and not self.unpacker.eof:
            try:
                piece = self.unpacker.decompress(self.pending, PIECE)
            except zlib.error as exc:
                raise LoadError(f"{self.where}: {FIELD} is not zlib-compressed ({exc})") from None
            self.pending = self.unpacker.unconsumed_tail
            if not piece and not self.pending:
                break  # the stream stops short: what came is all there is
            self.total += len(piece)
            if self.total > MAX_DECOMPRESSED:
                raise LoadError(f"{self.where}: {FIELD} decompresses to more than {MAX_DECOMPRESSED >> 20} MiB")
            self.buffer = self.buffer + piece if self.buffer else piece
        if len(self.buffer) <= size:  # all of it, without copying
            taken, self.buffer = self.buffer, b""
        else:
            taken, self.buffer = self.buffer[:size], self.buffer[size:]
        return taken


def pickled_text(stream: Inflating, where: str) -> Iterator[str]:
    """The one text the pickle holds, in pieces as it is read; the pickle is never unpickled."""
    texts = 0
    while True:
        code = stream.read(1)
        name = OPCODE_NAMES.get(code, f"unknown ({code!r})")
        if name == "STOP":
            break
        if name in FRAMING:
            _exactly(stream, FRAMING[name], where)
        elif name in TEXT_LENGTH:
            texts += 1
            form = TEXT_LENGTH[name]
            (length,) = struct.unpack(form, _exactly(stream, struct.calcsize(form), where))
            text = _utf8(stream, length, where)
            if texts == 1:
                yield from text
            else:  # read past, to name the opcode that does more, if one follows
                for _ in text:
                    pass
        else:
            raise LoadError(
                f"{where}: {FIELD} is a pickle that does more than hold one text (opcode {name}): refused, "
                "never unpickled"
            )
    if texts != 1:
        raise LoadError(f"{where}: {FIELD} is a pickle of {texts} texts, not one: refused, never unpickled")


def _exactly(stream: Inflating, size: int, where: str) -> bytes:
    data = stream.read(size)
    if len(data) < size:
        raise LoadError(f"{where}: {FIELD} is not a pickled text (it stops short)")
    return data


def _utf8(stream: Inflating, length: int, where: str) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")  # as pickle decodes its texts
    left = length
    try:
        while left:
            yield decoder.decode(_exactly(stream, min(left, PIECE), where))
            left -= min(left, PIECE)
        yield decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise LoadError(f"{where}: {FIELD} is not a pickled text (its text is not UTF-8)") from None


def json_cases(pieces: Iterator[str], most: int, where: str) -> list[Any]:
    """The items of the JSON list whose text comes in `pieces`, read one at a time as the text arrives:
    `LoadError` at the item past `most`, at an item longer than MAX_CASE_CHARS, or at text that is not a
    JSON list."""
    reader = _ListReader(most, where)
    try:
        for piece in pieces:
            reader.feed(piece)
        reader.feed("", final=True)
        if reader.state != "end":
            raise NotJson(f"{where}: {FIELD} is not valid JSON (the list is not closed)")
    except NotJson:
        for _ in pieces:  # a pickle that does more than hold a text says so first (its reader raises)
            pass
        raise
    return reader.items


class NotJson(LoadError):
    """The text is not a JSON list: said only once the pickle around it was read whole, and found to be one text."""


class _ListReader:
    """A JSON list read as its text arrives: `state` is what comes next (start, first, item, separator, end)."""

    def __init__(self, most: int, where: str):
        self.most = most
        self.where = where
        self.items: list[Any] = []
        self.state = "start"
        self.text = ""
        self.decoder = json.JSONDecoder()

    def feed(self, piece: str, final: bool = False) -> None:
        self.text += piece
        at = 0
        while True:
            at = SPACE.match(self.text, at).end()  # type: ignore[union-attr]
            if at == len(self.text):
                break
            step = self._step(at, final)
            if step is None:  # an item not whole yet: wait for more text
                break
            at = step
        self.text = self.text[at:]  # what is kept: at most the item being read
        if len(self.text) > MAX_CASE_CHARS:
            raise LoadError(f"{self.where}: {FIELD} holds a test case longer than {MAX_CASE_CHARS >> 20} MiB")

    def _step(self, at: int, final: bool) -> int | None:
        """Read what comes at `at`; the position after it, or None where more text is needed."""
        char = self.text[at]
        if self.state == "start" and char == "[":
            self.state = "first"
            return at + 1
        if self.state in ("first", "separator") and char == "]":
            self.state = "end"
            return at + 1
        if self.state == "separator" and char == ",":
            self.state = "item"
            return at + 1
        if self.state in ("first", "item"):
            return self._item(at, final)
        raise NotJson(f"{self.where}: {FIELD} is not a JSON list of test cases")

    def _item(self, at: int, final: bool) -> int | None:
        try:
            item, end = self.decoder.raw_decode(self.text, at)
        except (json.JSONDecodeError, RecursionError):
            if final:
                raise NotJson(f"{self.where}: {FIELD} is not valid JSON") from None
            return None
        if end == len(self.text) and not final:
            return None  # a number may go on in the next piece
        self.items.append(item)
        if len(self.items) > self.most:
            raise LoadError(
                f"{self.where}: {FIELD} holds more than {self.most} test cases (a problem may have {MAX_TESTS} in all)"
            )
        self.state = "separator"
        return end
