"""The trainer's losses on the tiny random Llama (CPU, float32): chunked log-probabilities against the full
logits, values and gradients, plain and LoRA; the policy and SFT losses by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from nanbeige.trainer.loss import policy_loss, sft_loss, token_logprobs

B, L = 2, 12


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny_loss"))


def load(folder: Any, lora: bool = False) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if lora:
        from peft import LoraConfig, get_peft_model

        # init_lora_weights=False: B is random too, so the adapters change the output and get gradients
        config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"], init_lora_weights=False)
        model = get_peft_model(model, config)
    return model


def batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (B, L), generator=generator)
    return input_ids, torch.ones(B, L, dtype=torch.long), input_ids[:, 1:]


def full_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float
) -> torch.Tensor:
    """The straightforward way: all logits [B, L, V] at once."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


@pytest.mark.parametrize("chunk_tokens", [3, L - 1, B * (L - 1), 1000])
def test_token_logprobs_match_full_logits(tiny_folder: Any, chunk_tokens: int) -> None:
    model = load(tiny_folder)
    input_ids, attention_mask, targets = batch(model.config.vocab_size)
    with torch.no_grad():
        expected = full_logprobs(model, input_ids, attention_mask, 0.7)
        got = token_logprobs(model, input_ids, attention_mask, targets, chunk_tokens=chunk_tokens, temperature=0.7)
    assert got.shape == (B, L - 1) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert (got < 0).all()


def test_token_entropy_is_the_full_distributions(tiny_folder: Any) -> None:
    model = load(tiny_folder)
    input_ids, attention_mask, targets = batch(model.config.vocab_size)
    logprobs, entropy = token_logprobs(
        model, input_ids, attention_mask, targets, chunk_tokens=5, temperature=0.7, entropy=True
    )
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float() / 0.7
        expected = torch.distributions.Categorical(logits=logits).entropy()  # [B, L-1]
    torch.testing.assert_close(entropy, expected, rtol=1e-5, atol=1e-5)
    assert logprobs.requires_grad and not entropy.requires_grad  # a metric only


def test_token_logprobs_with_padding(tiny_folder: Any) -> None:
    model = load(tiny_folder)
    input_ids, attention_mask, targets = batch(model.config.vocab_size)
    attention_mask[1, 8:] = 0  # row 1 is 8 real tokens, then padding
    with torch.no_grad():
        got = token_logprobs(model, input_ids, attention_mask, targets, chunk_tokens=5)
        expected = full_logprobs(model, input_ids, attention_mask, 1.0)
        alone = token_logprobs(model, input_ids[1:, :8], attention_mask[1:, :8], targets[1:, :7])
    real = attention_mask[:, 1:].bool()  # positions whose target is a real token
    torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1, :7], alone[0], rtol=1e-5, atol=1e-5)  # padding changes nothing before it
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("lora", [False, True])
def test_token_logprobs_gradients_match_full_logits(tiny_folder: Any, lora: bool) -> None:
    model = load(tiny_folder, lora=lora)
    input_ids, attention_mask, targets = batch(model.config.vocab_size, seed=1)
    weights = torch.randn(B, L - 1, generator=torch.Generator().manual_seed(2))
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if lora:
        assert {n for n, _ in named} and all("lora_" in n for n, _ in named)
    # count the LM head's forward calls: checkpointing runs each chunk again in backward
    calls = []
    model.get_output_embeddings().register_forward_hook(lambda *args: calls.append(1))

    (full_logprobs(model, input_ids, attention_mask, 0.8) * weights).sum().backward()
    expected = {name: p.grad.clone() for name, p in named}
    model.zero_grad()
    calls.clear()
    got = token_logprobs(model, input_ids, attention_mask, targets, chunk_tokens=5, temperature=0.8)
    assert len(calls) == 5  # ceil(22 / 5) chunks
    (got * weights).sum().backward()
    assert len(calls) == 10  # every chunk recomputed once in backward
    picked = [name for name, _ in named if "lm_head" in name or "embed" in name or "layers.1.self_attn.v" in name]
    assert len(picked) >= 3
    for name in picked:
        p = dict(named)[name]
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)


def test_token_logprobs_lora_values(tiny_folder: Any) -> None:
    model = load(tiny_folder, lora=True)
    input_ids, attention_mask, targets = batch(model.config.vocab_size)
    with torch.no_grad():
        got = token_logprobs(model, input_ids, attention_mask, targets, chunk_tokens=7)
        expected = full_logprobs(model, input_ids, attention_mask, 1.0)
        with model.disable_adapter():
            base = token_logprobs(model, input_ids, attention_mask, targets, chunk_tokens=7)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, base)  # the adapters are in the path


def loss_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    logprobs = (-torch.rand(B, L - 1, generator=generator) * 3).requires_grad_()
    advantages = torch.randn(B, L - 1, generator=generator)
    loss_mask = torch.zeros(B, L - 1)
    loss_mask[0, 2:9] = 1
    loss_mask[1, 4:6] = 1
    return logprobs, advantages, loss_mask


def first_step_loss(logprobs: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, dict]:
    """The loss at a batch's first optimizer step, where π_old is the current policy."""
    return policy_loss(logprobs, logprobs.detach(), *args, **kwargs)


def test_policy_loss_on_policy_is_advantage_weighted_logprob() -> None:
    logprobs, advantages, loss_mask = loss_inputs()
    loss, metrics = first_step_loss(logprobs, logprobs.detach().clone(), advantages, loss_mask, total_tokens=20.0)
    assert math.isclose(loss.item(), float(-(advantages * loss_mask).sum() / 20), rel_tol=1e-6)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, -advantages * loss_mask / 20)
    assert metrics["loss_tokens"] == 9
    assert metrics["tis_weight_mean"] == metrics["tis_weight_max"] == metrics["tis_weight_min"] == 1.0
    assert metrics["tis_capped_frac"] == 0 and metrics["start_drift_from_rollout"] == 0
    assert metrics["clip_frac"] == 0 and metrics["dual_clip_frac"] == 0  # the first step of a batch: ratio is 1
    on = loss_mask.bool()
    assert math.isclose(metrics["advantage_mean"], advantages[on].mean().item(), rel_tol=1e-5)
    assert math.isclose(metrics["advantage_std"], advantages[on].std(unbiased=False).item(), rel_tol=1e-5)


def test_policy_loss_caps_the_importance_weight() -> None:
    logprobs, advantages, loss_mask = loss_inputs()
    rollout = (logprobs.detach() - 5) * loss_mask  # the sampler found every token far less likely; 0 where masked
    loss, metrics = first_step_loss(logprobs, rollout, advantages, loss_mask, total_tokens=9.0, tis_cap=2.0)
    assert math.isclose(loss.item(), float(-2 * (advantages * loss_mask).sum() / 9), rel_tol=1e-6)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, -2 * advantages * loss_mask / 9)
    assert metrics["tis_capped_frac"] == 1 and metrics["tis_weight_max"] == metrics["tis_weight_min"] == 2.0
    assert math.isclose(metrics["start_drift_from_rollout"], 5.0, rel_tol=1e-5)
    # a weight below the cap is used as it is: exp(-0.5) when the sampler found the tokens likelier
    loss, metrics = first_step_loss(logprobs, logprobs.detach() + 0.5, advantages, loss_mask, total_tokens=9.0)
    assert math.isclose(loss.item(), float(-math.exp(-0.5) * (advantages * loss_mask).sum() / 9), rel_tol=1e-5)
    assert metrics["tis_capped_frac"] == 0
    # without rollout logprobs there is no weight
    loss, metrics = first_step_loss(
        logprobs, rollout, advantages, loss_mask, total_tokens=9.0, has_rollout_logprobs=False
    )
    assert math.isclose(loss.item(), float(-(advantages * loss_mask).sum() / 9), rel_tol=1e-6)
    assert "tis_weight_mean" not in metrics


def test_policy_loss_ignores_masked_tokens() -> None:
    logprobs, advantages, loss_mask = loss_inputs()
    rollout = logprobs.detach() * loss_mask
    loss, metrics = first_step_loss(logprobs, rollout, advantages, loss_mask, total_tokens=9.0)
    noisy_advantages = torch.where(loss_mask.bool(), advantages, torch.full_like(advantages, 1e6))
    noisy_rollout = torch.where(loss_mask.bool(), rollout, torch.full_like(rollout, -1e6))
    noisy_loss, noisy_metrics = first_step_loss(logprobs, noisy_rollout, noisy_advantages, loss_mask, total_tokens=9.0)
    assert torch.equal(loss, noisy_loss) and metrics == noisy_metrics
    noisy_loss.backward()
    assert (logprobs.grad[~loss_mask.bool()] == 0).all()


def test_policy_loss_micro_batches_add_up(tiny_folder: Any) -> None:
    model = load(tiny_folder)
    input_ids, attention_mask, targets = batch(model.config.vocab_size, seed=4)
    _, advantages, loss_mask = loss_inputs()  # rows with 7 and 2 loss tokens: per-row means would differ
    total = float(loss_mask.sum())

    def step(rows: slice) -> None:
        logprobs = token_logprobs(model, input_ids[rows], attention_mask[rows], targets[rows], chunk_tokens=4)
        rollout = (logprobs.detach() - 0.3) * loss_mask[rows]
        first_step_loss(logprobs, rollout, advantages[rows], loss_mask[rows], total_tokens=total)[0].backward()

    step(slice(0, 2))
    whole = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    step(slice(0, 1))
    step(slice(1, 2))
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, whole[name], rtol=1e-4, atol=1e-7, msg=name)


def test_sft_loss() -> None:
    logprobs, _, loss_mask = loss_inputs()
    loss, metrics = sft_loss(logprobs, loss_mask, total_tokens=18.0)
    assert math.isclose(loss.item(), float(-(logprobs.detach() * loss_mask).sum() / 18), rel_tol=1e-6)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, -loss_mask / 18)
    assert metrics["loss_tokens"] == 9
    assert math.isclose(metrics["nll"], float(-logprobs.detach()[loss_mask.bool()].mean()), rel_tol=1e-6)


def test_packed_rows_get_the_logprobs_and_gradients_they_get_alone(tiny_folder: Any) -> None:
    from nanbeige.trainer.batches import Sample
    from nanbeige.trainer.packing import collate, collate_packed

    model = load(tiny_folder)
    generator = torch.Generator().manual_seed(9)
    rows = [
        Sample(
            ids=torch.randint(1, model.config.vocab_size, (n,), generator=generator).tolist(),
            loss_mask=[0] + [1] * (n - 1),
            advantages=[1.0] * n,
            rollout_logprobs=None,
            group_id="g",
            trajectory_id=str(n),
            turns=[],
        )
        for n in (9, 5, 7)
    ]
    packed = collate_packed(rows, pad_id=0)
    together = token_logprobs(
        model, packed["input_ids"], None, packed["targets"], chunk_tokens=4, position_ids=packed["position_ids"]
    )
    together[packed["loss_mask"].bool()].sum().backward()
    packed_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    start = 0
    for row in rows:  # each alone, padded to the longest
        alone = collate([row], pad_id=0)
        logprobs = token_logprobs(model, alone["input_ids"], alone["attention_mask"], alone["targets"])
        torch.testing.assert_close(together[0, start : start + len(row.ids) - 1], logprobs[0], rtol=1e-5, atol=1e-5)
        logprobs.sum().backward()
        start += len(row.ids)
    for name, p in model.named_parameters():  # the rows did not read each other: the same gradients
        torch.testing.assert_close(packed_grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)
