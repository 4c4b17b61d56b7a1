"""What a policy makes of rollouts it is handed: the mean log-probability of each rollout's sampled tokens under
a model folder, computed with transformers alone (`real_vllm.model_logprobs`, not the trainer's code), so that a
test can see whether a training step made the rewarded rollouts more likely."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from real_vllm import model_logprobs


def mean_logprobs(folder: Path, trajectories: list[Any]) -> dict[str, float]:
    """Each one-turn trajectory's mean log-probability of its completion ids after its prompt ids, under the
    model in `folder` (at temperature 1, the rollouts' own), by trajectory id."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    found = {}
    for trajectory in trajectories:
        [turn] = trajectory.turns
        found[trajectory.id] = statistics.fmean(model_logprobs(model, turn.prompt_delta_ids, turn.completion_ids))
    return found
