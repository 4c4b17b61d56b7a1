"""`--grader token-f1`: partial credit for a short answer, the word-overlap F1 of SQuAD's official evaluation
(v1.1) between the answer and the reference answer, both normalised its way: lower case, ASCII punctuation
dropped, the articles a/an/the dropped, whitespace runs as one space.

Why a second outcome grader beside exact match: a small model answers in sentences ("The capital of France is
Paris."), which exact match scores 0 however right, so every group of its rollouts is alike and GRPO has
nothing to compare. F1 scores that sentence 1/3, a wrong city 0 and "Paris" 1: the rewards differ, and only the
exact words earn 1. Repeating the reference counts once (the overlap is of word counts).

What it pays for without the answer, as a policy would find it: a hedge earns a share whichever candidate is
right ("Paris Lyon" 2/3, three candidates 1/2), so a policy torn between two answers earns more by listing
both unless it is right more than two thirds of the time; and a shared common word earns something ("of"
against "Battle of Hastings" 1/2), since SQuAD drops only the articles. It suits getting a model that answers
in sentences to answer at all; train the answer itself with exact match. Punctuation is ASCII's, so it suits
answers in English.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from nanbeige.evals.tasks import Verdict

TOKEN_F1 = "token-f1"
_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalized_words(text: str) -> list[str]:
    """SQuAD's `normalize_answer`, split into words: lower case, punctuation removed, articles removed."""
    text = "".join(character for character in text.lower() if character not in _PUNCTUATION)
    return _ARTICLES.sub(" ", text).split()


def f1(prediction: str, reference: str) -> float:
    """The harmonic mean of precision (shared words / the answer's words) and recall (shared words / the
    reference's words), shared words counted with multiplicity; 0.0 when none is shared. Where either has no
    words left (a reference of only an article), 1.0 when both have none, as SQuAD v2.0's script scores it."""
    answer, gold = normalized_words(prediction), normalized_words(reference)
    if not answer or not gold:
        return float(answer == gold)
    shared = sum((Counter(answer) & Counter(gold)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(answer), shared / len(gold)
    return 2 * precision * recall / (precision + recall)


def grade_f1(prediction: str | None, reference: str) -> Verdict:
    """The F1 as the verdict's `score` (the reward); `correct` when the normalised words are equal (SQuAD's
    exact match), which is what the group filter and the pass rate count."""
    if prediction is None:
        return Verdict(correct=False, grader=TOKEN_F1, score=0.0, reason="no answer")
    score = f1(prediction, reference)
    correct = normalized_words(prediction) == normalized_words(reference)
    reason = "" if correct else f"word-overlap F1 {score:.3f} with the reference answer"
    return Verdict(correct=correct, grader=TOKEN_F1, extracted=prediction, reason=reason, score=score)
