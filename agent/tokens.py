"""Token-exact records: each turn's prompt as a delta from the previous turn, grouped in segments.

Within a segment every prompt extends the previous prompt + completion, so a turn stores only the
new prompt tokens (tool results, template glue). When the prompt stops extending (context
management rewrote the history) a new segment starts and the turn stores its whole prompt.
Storage is O(turns), not O(turns^2). `prefix_hash` is a SHA-256 over the segment's tokens before
the delta (as native int32), so a rebuilt segment can be checked token for token.
"""

from __future__ import annotations

import hashlib
from array import array

from nanbeige.agent.trajectory import Turn


def _ids_bytes(ids: list[int]) -> bytes:
    return array("i", ids).tobytes()  # int32 on every platform CPython supports


class TokenTracker:
    """Follows one trajectory's token stream and fills each turn's token record."""

    def __init__(self) -> None:
        self.segment = -1
        self.ids: list[int] = []  # the current segment: last prompt + last completion
        self._hash = hashlib.sha256()

    def record(self, turn: Turn, prompt_ids: list[int], completion_ids: list[int]) -> None:
        n = len(self.ids)
        extends = self.segment >= 0 and len(prompt_ids) >= n and prompt_ids[:n] == self.ids
        if extends:
            delta = prompt_ids[n:]
        else:
            self.segment += 1
            self.ids, self._hash, delta = [], hashlib.sha256(), list(prompt_ids)
        turn.segment = self.segment
        turn.prefix_hash = self._hash.hexdigest()
        turn.prompt_delta_ids = delta
        turn.completion_ids = list(completion_ids)
        self.ids.extend(delta)
        self.ids.extend(completion_ids)
        self._hash.update(_ids_bytes(delta) + _ids_bytes(completion_ids))


def rebuild_segments(turns: list[Turn]) -> dict[int, list[int]]:
    """Each segment's full token sequence (last prompt + last completion), rebuilt from the deltas.

    Raises ValueError when a stored prefix hash does not match the rebuilt tokens."""
    segments: dict[int, list[int]] = {}
    hashes: dict[int, hashlib._Hash] = {}
    for turn in turns:
        if turn.segment is None or turn.prompt_delta_ids is None or turn.completion_ids is None:
            continue
        ids = segments.setdefault(turn.segment, [])
        hasher = hashes.setdefault(turn.segment, hashlib.sha256())
        if hasher.hexdigest() != turn.prefix_hash:
            raise ValueError(f"turn {turn.index}: prefix hash does not match segment {turn.segment}")
        ids.extend(turn.prompt_delta_ids)
        ids.extend(turn.completion_ids)
        hasher.update(_ids_bytes(turn.prompt_delta_ids) + _ids_bytes(turn.completion_ids))
    return segments


def full_prompt(turns: list[Turn], index: int) -> list[int]:
    """The exact prompt token ids sent for turn `index`, rebuilt from its segment."""
    target = turns[index]
    ids: list[int] = []
    for turn in turns[: index + 1]:
        if turn.segment != target.segment or turn.prompt_delta_ids is None:
            continue
        ids.extend(turn.prompt_delta_ids)
        if turn.index != index:
            ids.extend(turn.completion_ids or [])
    return ids
