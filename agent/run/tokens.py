"""Token-exact records: each turn's prompt stored as a delta from the previous turn.

A turn's prompt is the previous turn's prompt + completion, cut to its first `prompt_keep` tokens,
followed by `prompt_delta_ids`. While the prompt only extends the previous one (nothing was
rewritten) `prompt_keep` is that whole length and the turns form one segment, which the trainer
can merge into one row. When context management rewrites the history (keep-K replaces an old tool
result), the prompt diverges part-way, `prompt_keep` is where, and a new segment starts; the delta
is still only what follows the divergence, so storage stays O(turns), not O(turns^2).
`prefix_hash` is the SHA-256 of the kept tokens (as int32), so a rebuilt prompt can be checked.
`training_rows` turns the records into what a trainer reads: one row of token ids per segment, with
the sampled tokens marked for the loss.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from nanbeige.agent.trajectory.trajectory import Turn

_CHUNK = 4096


def _hash(ids: array) -> str:
    return hashlib.sha256(ids.tobytes()).hexdigest()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id lists or arrays (compared a chunk at a time in C)."""
    n = min(len(a), len(b))
    if (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):  # slice (copy) only the longer one
        return n
    start = 0
    while a[start : start + _CHUNK] == b[start : start + _CHUNK]:
        start += _CHUNK
    while a[start] == b[start]:
        start += 1
    return start


class TokenTracker:
    """Follows one trajectory's token stream and fills each turn's token record.

    A turn's cost does not grow with the history while it only extends it: the prefix hash is
    carried forward from SHA-256 states saved at turn boundaries, so each token is hashed once
    (a rewrite re-hashes only from the last boundary before it)."""

    def __init__(self) -> None:
        self.segment = -1
        self.ids: list[int] = []  # the previous turn's prompt + completion
        self.states: list[tuple[int, Any]] = [(0, hashlib.sha256())]  # (position in ids, hash of ids[:position])

    def record(self, turn: Turn, prompt_ids: list[int], completion_ids: list[int]) -> None:
        keep = common_prefix(self.ids, prompt_ids)
        if self.segment < 0 or keep < len(self.ids):
            self.segment += 1
        turn.segment = self.segment
        turn.prompt_keep = keep
        turn.prefix_hash = self._prefix_hash(keep)
        turn.prompt_delta_ids = prompt_ids[keep:]
        turn.completion_ids = completion_ids
        self.ids = prompt_ids + completion_ids

    def _prefix_hash(self, keep: int) -> str:
        """SHA-256 of `self.ids[:keep]` as int32, from the last saved state at or before `keep`."""
        while self.states[-1][0] > keep:
            self.states.pop()  # past the point where the history was rewritten
        position, state = self.states[-1]
        if position < keep:
            state = state.copy()
            state.update(array("i", self.ids[position:keep]).tobytes())
            self.states.append((keep, state))
        return state.hexdigest()


def iter_prompts(turns: list[Turn]) -> Iterator[tuple[Turn, list[int]]]:
    """Each token-recorded turn with the exact prompt ids sent for it, rebuilt from the deltas.

    Raises ValueError when a stored prefix hash does not match the rebuilt tokens."""
    previous = array("i")
    for turn in turns:
        if turn.prompt_delta_ids is None or turn.completion_ids is None or turn.prompt_keep is None:
            continue
        kept = previous[: turn.prompt_keep]
        if _hash(kept) != turn.prefix_hash:
            raise ValueError(f"turn {turn.index}: prefix hash does not match the rebuilt tokens")
        kept.extend(turn.prompt_delta_ids)
        yield turn, kept.tolist()
        kept.extend(turn.completion_ids)
        previous = kept


def last_prompt(turns: list[Turn]) -> tuple[Turn, list[int]] | None:
    """The last token-recorded turn and the prompt ids sent for it (a resumed run starts from them).

    Rebuilt backwards, touching only the ids that survive into that prompt: with keep-K rewriting
    the prompt every turn most of each delta was cut again later, and the file can hold far more ids
    than the prompt. Only that turn's prefix hash is checked; ValueError when it does not match."""
    recorded = [
        t
        for t in turns
        if t.prompt_delta_ids is not None and t.completion_ids is not None and t.prompt_keep is not None
    ]
    if not recorded:
        return None
    last = recorded[-1]
    pieces, need = [last.prompt_delta_ids], last.prompt_keep  # need: how many leading ids are still missing
    for turn in reversed(recorded[:-1]):
        if need > turn.prompt_keep:  # ids from this turn's delta and completion survive, up to `need`
            wanted = need - turn.prompt_keep
            pieces += [
                turn.completion_ids[: max(wanted - len(turn.prompt_delta_ids), 0)],
                turn.prompt_delta_ids[:wanted],
            ]
            need = turn.prompt_keep
        if need == 0:
            break
    prompt = [i for piece in reversed(pieces) for i in piece]
    if need or _hash(array("i", prompt[: last.prompt_keep])) != last.prefix_hash:
        raise ValueError(f"turn {last.index}: prefix hash does not match the rebuilt tokens")
    return last, prompt


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


@dataclass
class TrainingRow:
    """One segment of a trajectory as a trainer reads it."""

    segment: int
    """The token segment the row holds."""
    ids: list[int]
    """The segment's last prompt followed by that turn's completion: every earlier turn of the
    segment is inside it, its completion right after its own prompt."""
    loss_mask: list[int]
    """1 where `ids` holds a token the model sampled in a turn with `mask == 1`; 0 on the prompt,
    tool results, template glue, and the completions of turns with `mask == 0`."""
    logprobs: list[float] | None
    """Aligned to `ids`: the sampling logprob at each completion position, 0.0 elsewhere; None when a
    turn in the row was recorded without logprobs."""
    turns: list[int]
    """Indices of the turns in the row, in order."""


def training_rows(turns: list[Turn]) -> list[TrainingRow]:
    """One training row per segment of a trajectory's token-recorded turns, in segment order.

    Within a segment a prompt is the previous prompt + completion + what came after it (tool results,
    template glue), so a row grows by each turn's new prompt tokens (loss mask 0) and its completion
    (loss mask 1, or 0 for a turn with `mask == 0`). Raises ValueError when a prefix hash does not
    check, a turn's logprobs do not match its completion ids, or a turn of a segment does not extend it."""
    rows: list[TrainingRow] = []
    for turn, prompt in iter_prompts(turns):
        completion = turn.completion_ids
        if turn.logprobs is not None and len(turn.logprobs) != len(completion):
            raise ValueError(f"turn {turn.index}: {len(turn.logprobs)} logprobs for {len(completion)} completion ids")
        if not rows or rows[-1].segment != turn.segment:
            rows.append(TrainingRow(segment=turn.segment, ids=[], loss_mask=[], logprobs=[], turns=[]))
            new_prompt = prompt
        elif turn.prompt_keep == len(rows[-1].ids):
            new_prompt = turn.prompt_delta_ids  # the row so far is this prompt's start: append only the rest
        else:
            raise ValueError(f"turn {turn.index}: its prompt does not extend segment {turn.segment}")
        row = rows[-1]
        _append(row, new_prompt, 0, [0.0] * len(new_prompt))
        _append(row, completion, 1 if turn.mask else 0, turn.logprobs)
        row.turns.append(turn.index)
    return rows


def _append(row: TrainingRow, ids: list[int], trained: int, logprobs: list[float] | None) -> None:
    row.ids += ids
    row.loss_mask += [trained] * len(ids)
    if row.logprobs is not None and logprobs is not None:
        row.logprobs += logprobs
    else:
        row.logprobs = None  # one turn without logprobs: the row has none to align
