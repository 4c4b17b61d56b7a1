"""Token-exact records: each turn's prompt stored as a delta from the previous turn.

A turn's prompt is the previous turn's prompt + completion, cut to its first `prompt_keep` tokens,
followed by `prompt_delta_ids`. While the prompt only extends the previous one (nothing was
rewritten) `prompt_keep` is that whole length and the turns form one segment, which the trainer
can merge into one row. When context management rewrites the history (keep-K replaces an old tool
result), the prompt diverges part-way, `prompt_keep` is where, and a new segment starts; the delta
is still only what follows the divergence, so storage stays O(turns), not O(turns^2).
`prefix_hash` is the SHA-256 of the kept tokens (as int32), so a rebuilt prompt can be checked.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator

from nanbeige.agent.trajectory import Turn

_CHUNK = 4096


def _hash(ids: array) -> str:
    return hashlib.sha256(ids.tobytes()).hexdigest()


def common_prefix(a: array, b: array) -> int:
    """Length of the longest common prefix of two id arrays (compared a chunk at a time in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    start = 0
    while a[start:start + _CHUNK] == b[start:start + _CHUNK]:
        start += _CHUNK
    while a[start] == b[start]:
        start += 1
    return start


class TokenTracker:
    """Follows one trajectory's token stream and fills each turn's token record."""

    def __init__(self) -> None:
        self.segment = -1
        self.ids = array("i")  # the previous turn's prompt + completion

    def record(self, turn: Turn, prompt_ids: list[int], completion_ids: list[int]) -> None:
        prompt = array("i", prompt_ids)
        keep = common_prefix(self.ids, prompt)
        if self.segment < 0 or keep < len(self.ids):
            self.segment += 1
        turn.segment = self.segment
        turn.prompt_keep = keep
        turn.prefix_hash = _hash(self.ids[:keep])
        turn.prompt_delta_ids = prompt_ids[keep:]
        turn.completion_ids = completion_ids
        prompt.extend(completion_ids)
        self.ids = prompt


def iter_prompts(turns: list[Turn]) -> Iterator[tuple[Turn, list[int]]]:
    """Each token-recorded turn with the exact prompt ids sent for it, rebuilt from the deltas.

    Raises ValueError when a stored prefix hash does not match the rebuilt tokens."""
    previous = array("i")
    for turn in turns:
        if turn.prompt_delta_ids is None or turn.completion_ids is None or turn.prompt_keep is None:
            continue
        kept = previous[:turn.prompt_keep]
        if _hash(kept) != turn.prefix_hash:
            raise ValueError(f"turn {turn.index}: prefix hash does not match the rebuilt tokens")
        kept.extend(turn.prompt_delta_ids)
        yield turn, kept.tolist()
        kept.extend(turn.completion_ids)
        previous = kept


def full_prompt(turns: list[Turn], index: int) -> list[int]:
    """The exact prompt token ids sent for turn `index`."""
    for turn, prompt in iter_prompts(turns):
        if turn.index == index:
            return prompt
    raise ValueError(f"turn {index} has no token record")


def rebuild_segments(turns: list[Turn]) -> dict[int, list[int]]:
    """Each segment's full token sequence: its last prompt followed by that turn's completion."""
    segments = {}
    for turn, prompt in iter_prompts(turns):
        segments[turn.segment] = prompt + turn.completion_ids
    return segments
