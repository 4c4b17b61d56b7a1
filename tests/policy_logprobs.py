"""What a policy makes of rollouts it is handed: the mean log-probability of each rollout's sampled tokens under
a model folder, computed with transformers alone (not the trainer's code), so that a test can see whether a
training step made the rewarded rollouts more likely."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def mean_logprobs(folder: Path, trajectories: list[Any], temperature: float = 1.0) -> dict[str, float]:
    """Each one-turn trajectory's mean log-probability of its completion ids after its prompt ids, under the
    model in `folder` at the sampling temperature, by trajectory id."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    model.eval()
    found = {}
    with torch.no_grad():
        for trajectory in trajectories:
            [turn] = trajectory.turns
            prompt, completion = turn.prompt_delta_ids, turn.completion_ids
            ids = torch.tensor([prompt + completion])
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature  # (completion, vocab)
            logprobs = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion)[:, None])
            found[trajectory.id] = logprobs.mean().item()
    return found
