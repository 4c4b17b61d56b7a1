"""GAIA's quasi-exact match, as the official leaderboard scores answers.

A gold answer that reads as a number is compared as a number (after dropping `$`, `%` and `,`); a gold
answer with `,` or `;` is a list, compared element by element in order; anything else is compared as a
string with all whitespace and ASCII punctuation removed and case ignored. The scorer reads the short
answer (the last `\\boxed{}` or the text after `FINAL ANSWER:`), never the whole response.
"""

from __future__ import annotations

import math
import re
import string

from nanbeige.evals.tasks import Verdict

_NUMBER_NOISE = str.maketrans("", "", "$%,")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def _as_number(text: str) -> float:
    """The text as a number, or infinity (equal to nothing the gold can be) when it is not one."""
    try:
        return float(text.translate(_NUMBER_NOISE))
    except ValueError:
        return math.inf


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _squeeze(text: str, drop_punctuation: bool = True) -> str:
    """Lowercase with every whitespace character removed, and ASCII punctuation too unless told not to."""
    squeezed = re.sub(r"\s", "", text).lower()
    return squeezed.translate(_PUNCTUATION) if drop_punctuation else squeezed


def _same_elements(answer: str, gold: str) -> bool:
    answer_items = re.split(r"[,;]", answer)
    gold_items = re.split(r"[,;]", gold)
    if len(answer_items) != len(gold_items):
        return False
    for answer_item, gold_item in zip(answer_items, gold_items):
        if _is_number(gold_item):
            same = _as_number(answer_item) == float(gold_item)
        else:
            # Inside a list the official scorer keeps punctuation: "St. Louis" and "St Louis" differ here.
            same = _squeeze(answer_item, drop_punctuation=False) == _squeeze(gold_item, drop_punctuation=False)
        if not same:
            return False
    return True


def question_scorer(model_answer: str | None, ground_truth: str) -> bool:
    """Whether `model_answer` matches `ground_truth` under GAIA's rules (a missing answer reads as "None")."""
    answer = "None" if model_answer is None else model_answer
    if _is_number(ground_truth):
        return _as_number(answer) == float(ground_truth)
    if "," in ground_truth or ";" in ground_truth:
        return _same_elements(answer, ground_truth)
    return _squeeze(answer) == _squeeze(ground_truth)


def grade_exact(prediction: str | None, gold: str) -> Verdict:
    """The GAIA scorer's decision on a short answer, as a `Verdict` from the `gaia-exact` grader."""
    correct = question_scorer(prediction, gold)
    reason = "" if correct else f"{prediction!r} does not match the gold answer"
    return Verdict(correct=correct, grader="gaia-exact", extracted=prediction, reason=reason)
