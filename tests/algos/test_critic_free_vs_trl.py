"""GRPO, RLOO and REINFORCE++ against TRL's own trainers on identical batches.

TRL samples the batch: its trainer generates n answers per prompt with the tiny Llama (a LoRA adapter
with random weights, so the policy differs from the reference), scores them with a reward function
and computes its advantages (`_generate_and_score_completions`). Ours are computed from the same
rewards and group ids; the loss and its gradients from `critic_free_batch_loss` on the same token ids
(packed: each prompt once, its n answers as branches) against TRL's `_compute_loss`. The old policy's
log-probabilities are TRL's plus noise, the same on both sides, so the ratios are clipped.
REINFORCE++ is not in TRL: its advantage is checked against the paper's formula written out token by
token, and its loss (per-token advantages) against TRL's GRPO loss fed the same advantages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from online_rl.algos import CriticFreeConfig, critic_free_advantages
from online_rl.algos.batch import critic_free_batch_loss
from online_rl.algos.ops import masked

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
# Prompts of one length (6 tokens): TRL left-pads prompts and its forward then shifts their positions,
# a difference of layout, not of algorithm, that this check is not about.
PROMPTS = ["Write a haiku about rain", "Name a colour of the sky", "Tell me a story about cats",
           "The best way to learn is"]
N = 4


def _reward(completion_ids: list[list[int]], **_: Any) -> list[float]:
    """Deterministic in the answer's tokens, and varied enough that groups have spread."""
    return [float(sum(1 for t in ids if t % 3 == 0)) - 0.1 * len(ids) for ids in completion_ids]


def _trainer(kind: str, tiny_model: Path, tmp_path: Path, **options: Any) -> Any:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    # The random model almost never samples EOS. Generation also stops at any of a tenth of the
    # vocabulary, then pads with EOS (this tokenizer's pad token), so answers have several lengths and
    # TRL's mask (up to the first EOS) exercises padding. Only the sampling changes, not the model.
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    stops = {"eos_token_id": [tokenizer.eos_token_id, *range(100, 5000)]}
    peft = LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    common = {"output_dir": str(tmp_path), "report_to": [], "use_cpu": True,
              "per_device_train_batch_size": len(PROMPTS) * N, "num_generations": N,
              "max_completion_length": 10, "temperature": 1.0, "seed": 0, "generation_kwargs": stops,
              "bf16": False}  # float32 on both sides: TRL would otherwise autocast its forward to bfloat16
    data = Dataset.from_list([{"prompt": p} for p in PROMPTS])
    if kind == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        trainer = GRPOTrainer(model=model, reward_funcs=_reward, args=GRPOConfig(**common, **options),
                              train_dataset=data, processing_class=tokenizer, peft_config=peft)
    else:
        from trl import RLOOConfig, RLOOTrainer

        trainer = RLOOTrainer(model=model, reward_funcs=_reward, args=RLOOConfig(**common, **options),
                              train_dataset=data, processing_class=tokenizer, peft_config=peft)
    torch.manual_seed(0)
    for name, parameter in trainer.model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.3)
    trainer.model.eval()  # TRL's eval mode: no gradient-accumulation scaling of the loss
    return trainer


def _sampled(trainer: Any) -> dict[str, Any]:
    torch.manual_seed(1)
    return dict(trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS for _ in range(N)]))


def _groups_of(batch: dict[str, Any]) -> tuple[list[tuple[list[int], list[list[int]]]], torch.Tensor, int]:
    """TRL's padded batch as our groups: (prompt ids, its n answers' ids), the rewards, the width."""
    assert bool(batch["prompt_mask"].all()), "prompts of one length: no left padding"
    prompts = [ids[mask.bool()].tolist() for ids, mask in zip(batch["prompt_ids"], batch["prompt_mask"],
                                                              strict=True)]
    answers = [ids[mask.bool()].tolist() for ids, mask in zip(batch["completion_ids"],
                                                              batch["completion_mask"], strict=True)]
    groups = [(prompts[g * N], answers[g * N:(g + 1) * N]) for g in range(len(PROMPTS))]
    for g, (prompt, _) in enumerate(groups):
        assert all(p == prompt for p in prompts[g * N:(g + 1) * N])
    width = max(len(a) for a in answers)
    assert width > 1 and len({len(a) for a in answers}) > 1, "answers of several lengths make a real check"
    return groups, torch.tensor(_reward(answers)), width


def _token_logps(trainer: Any, batch: dict[str, Any]) -> torch.Tensor:
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, attention, batch["completion_ids"].size(1))
    return logps


GROUP_IDS = torch.arange(len(PROMPTS)).repeat_interleave(N)


@pytest.mark.parametrize(
    ("options", "ours"),
    [({"loss_type": "dapo", "beta": 0.0, "epsilon_high": 0.28, "scale_rewards": "group"},
      CriticFreeConfig(loss_aggregation="token-mean", clip_high=0.28, drop_zero_variance=False)),
     ({"loss_type": "grpo", "beta": 0.04, "scale_rewards": "batch"},
      CriticFreeConfig(loss_aggregation="seq-mean-token-mean", beta=0.04, clip_high=0.2,
                       scale_rewards="batch", drop_zero_variance=False)),
     ({"loss_type": "dr_grpo", "beta": 0.0, "scale_rewards": "none"},
      CriticFreeConfig(loss_aggregation="seq-mean-token-sum-norm", max_tokens=10, clip_high=0.2,
                       scale_rewards="none", drop_zero_variance=False))],
    ids=["dapo-token-level-clip-higher", "grpo-kl-batch-std", "dr-grpo"],
)
def test_grpo_matches_trl(tiny_model: Path, tmp_path: Path, options: dict[str, Any],
                          ours: CriticFreeConfig) -> None:
    trainer = _trainer("grpo", tiny_model, tmp_path, **options)
    batch = _sampled(trainer)
    groups, rewards, width = _groups_of(batch)

    advantages = critic_free_advantages(ours, rewards, GROUP_IDS).advantages
    assert torch.allclose(advantages, batch["advantages"], atol=1e-5), (advantages, batch["advantages"])

    generator = torch.Generator().manual_seed(2)
    logps = _token_logps(trainer, batch)
    old = logps + 0.3 * torch.randn(logps.shape, generator=generator)  # clipped ratios on both sides
    batch["old_per_token_logps"] = old
    model = trainer.model
    lora = [p for p in model.parameters() if p.requires_grad]
    expected = trainer._compute_loss(model, batch)
    expected_grads = torch.autograd.grad(expected, lora)

    actual = critic_free_batch_loss(model, groups, advantages, ours, old_logprobs=old[:, :width])
    actual_grads = torch.autograd.grad(actual.loss, lora)

    assert float(actual.clip_fraction) > 0, "some ratios must be clipped for a real check"
    assert torch.allclose(actual.loss, expected, atol=1e-5), (actual.loss.item(), expected.item())
    for mine, theirs in zip(actual_grads, expected_grads, strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5, rtol=1e-4), float((mine - theirs).abs().max())


@pytest.mark.parametrize(("beta", "normalize"), [(0.0, False), (0.05, True)], ids=["plain", "kl-normalized"])
def test_rloo_advantages_loss_and_gradients_match_trl(tiny_model: Path, tmp_path: Path, beta: float,
                                                      normalize: bool) -> None:
    trainer = _trainer("rloo", tiny_model, tmp_path, beta=beta, normalize_advantages=normalize)
    batch = _sampled(trainer)
    groups, rewards, width = _groups_of(batch)
    ours = CriticFreeConfig(estimator="rloo", kl_coef=beta, normalize=normalize, ratio_level="sequence",
                            clip_high=0.2, drop_zero_variance=False)

    model = trainer.model
    mask = batch["completion_mask"][:, :width]
    logps = _token_logps(trainer, batch)[:, :width]
    with torch.no_grad(), model.disable_adapter():
        ref = _token_logps(trainer, batch)[:, :width]
    advantages = critic_free_advantages(ours, rewards, GROUP_IDS, logps, ref, mask).advantages
    assert torch.allclose(advantages, batch["advantages"], atol=1e-5), (advantages, batch["advantages"])

    generator = torch.Generator().manual_seed(2)
    old = logps + 0.1 * torch.randn(logps.shape, generator=generator)
    batch["old_logps"] = masked(old, mask).sum(-1)
    lora = [p for p in model.parameters() if p.requires_grad]
    expected = trainer._compute_loss(model, batch)
    expected_grads = torch.autograd.grad(expected, lora)

    actual = critic_free_batch_loss(model, groups, advantages, ours, old_logprobs=old)
    actual_grads = torch.autograd.grad(actual.loss, lora)

    assert float(actual.clip_fraction) > 0, "some ratios must be clipped for a real check"
    assert torch.allclose(actual.loss, expected, atol=1e-5), (actual.loss.item(), expected.item())
    for mine, theirs in zip(actual_grads, expected_grads, strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5, rtol=1e-4), float((mine - theirs).abs().max())


def _reinforce_pp_by_hand(rewards: list[float], logps: list[list[float]], ref: list[list[float]], beta: float,
                          gamma: float) -> list[list[float]]:
    """REINFORCE++ (Hu et al., 2025) written out with loops: r_t = -beta * (log pi - log pi_ref) per
    token, plus the answer's reward on its last token; G_t = r_t + gamma * G_{t+1}; then every G_t of
    the batch shifted by the batch's mean and divided by its (unbiased) standard deviation."""
    returns = []
    for reward, row, ref_row in zip(rewards, logps, ref, strict=True):
        token = [-beta * (a - b) for a, b in zip(row, ref_row, strict=True)]
        token[-1] += reward
        out, running = [0.0] * len(token), 0.0
        for t in reversed(range(len(token))):
            running = token[t] + gamma * running
            out[t] = running
        returns.append(out)
    flat = [g for row in returns for g in row]
    mean = sum(flat) / len(flat)
    std = (sum((g - mean) ** 2 for g in flat) / (len(flat) - 1)) ** 0.5
    return [[(g - mean) / std for g in row] for row in returns]


@pytest.mark.parametrize("baseline", [False, True], ids=["reinforce++", "reinforce++-baseline"])
def test_reinforce_pp_matches_the_formula_and_trls_loss(tiny_model: Path, tmp_path: Path,
                                                        baseline: bool) -> None:
    trainer = _trainer("grpo", tiny_model, tmp_path, loss_type="dapo", beta=0.0, epsilon_high=0.28)
    batch = _sampled(trainer)
    groups, rewards, width = _groups_of(batch)
    model = trainer.model
    mask = batch["completion_mask"][:, :width]
    logps = _token_logps(trainer, batch)[:, :width]
    with torch.no_grad(), model.disable_adapter():
        ref = _token_logps(trainer, batch)[:, :width]
    ours = CriticFreeConfig(estimator="reinforce++-baseline" if baseline else "reinforce++", kl_coef=0.1,
                            gamma=0.99, clip_high=0.28, drop_zero_variance=False)
    advantages = critic_free_advantages(ours, rewards, GROUP_IDS, logps, ref, mask).advantages

    scores = rewards.tolist()
    if baseline:  # each reward less its group's mean
        means = [sum(scores[g * N:(g + 1) * N]) / N for g in range(len(PROMPTS))]
        scores = [r - means[i // N] for i, r in enumerate(scores)]
    lengths = mask.sum(-1).long().tolist()
    by_hand = _reinforce_pp_by_hand(scores, [r[:n] for r, n in zip(logps.tolist(), lengths, strict=True)],
                                    [r[:n] for r, n in zip(ref.tolist(), lengths, strict=True)], 0.1, 0.99)
    for row, expected_row, n in zip(advantages.tolist(), by_hand, lengths, strict=True):
        assert row[:n] == pytest.approx(expected_row, abs=1e-5)
        assert all(v == 0.0 for v in row[n:])

    padded = torch.zeros(batch["completion_ids"].shape)
    padded[:, :width] = advantages
    batch["advantages"] = padded  # TRL's loss takes per-token advantages too
    old = logps + 0.3 * torch.randn(logps.shape, generator=torch.Generator().manual_seed(2))
    batch["old_per_token_logps"] = torch.zeros(batch["completion_ids"].shape)
    batch["old_per_token_logps"][:, :width] = old
    lora = [p for p in model.parameters() if p.requires_grad]
    expected = trainer._compute_loss(model, batch)
    actual = critic_free_batch_loss(model, groups, advantages, ours, old_logprobs=old)
    assert torch.allclose(actual.loss, expected, atol=1e-5), (actual.loss.item(), expected.item())
    for mine, theirs in zip(torch.autograd.grad(actual.loss, lora), torch.autograd.grad(expected, lora),
                            strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5, rtol=1e-4), float((mine - theirs).abs().max())
