"""One batch's loss for each algorithm, from token ids to a differentiable scalar.

Each function packs its samples (every prompt once, no padding), computes the reference
log-probabilities with the LoRA adapter disabled (no autograd, no second model in memory), runs the
policy once with autograd, and applies the pure loss. Mixed precision: matrix products in bfloat16
(where the CPU or GPU has fast bfloat16 units) and log-softmax in float32; the LoRA weights stay in
float32. The optimizer step is the caller's. Pure torch: no Ray, Kafka or MLflow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from online_rl.algos.anchor import token_kl
from online_rl.algos.config import CriticFreeConfig, DPOConfig, KTOConfig, RewardModelConfig
from online_rl.algos.critic_free import critic_free_loss
from online_rl.algos.dpo import PreferenceLoss, dpo_loss
from online_rl.algos.kto import KTOLoss, kto_loss, kto_reference_point, mismatched_pairs
from online_rl.algos.logprobs import (
    PackedBatch,
    PolicyOutput,
    Sample,
    forward,
    next_token_logprobs,
    pack,
    reference_policy,
)
from online_rl.algos.ppo import PolicyLoss
from online_rl.algos.reward_model import PairLoss, RewardModel, bradley_terry_loss, thumbs_loss
from online_rl.hardware import Precision

__all__ = [
    "AnchorKL",
    "Precision",
    "TokenIds",
    "anchor_kl_batch_loss",
    "autocast",
    "critic_free_batch_loss",
    "dpo_batch_loss",
    "implicit_rewards",
    "kto_batch_loss",
    "reference_logprobs",
    "reward_batch_loss",
]

TokenIds = Sequence[int]


@contextmanager
def autocast(precision: Precision, device: str = "cpu") -> Iterator[None]:
    """bfloat16 matrix products (float32 elsewhere) for 'bf16'; nothing for 'fp32'."""
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision {precision!r} is not one of fp32, bf16")
    context = torch.autocast(device, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
    with context:
        yield


def reference_logprobs(model: Any, batch: PackedBatch, precision: Precision = "fp32",
                       reference: str | None = None) -> PolicyOutput:
    """The reference policy's log-probabilities, no autograd: the same model with its adapter disabled,
    or with the frozen adapter `reference` active instead (see `reference_policy`)."""
    with torch.no_grad(), reference_policy(model, reference), autocast(precision, _device(model)):
        return forward(model, batch)


def dpo_batch_loss(model: Any, pairs: Sequence[tuple[TokenIds, TokenIds, TokenIds]], config: DPOConfig,
                   precision: Precision = "fp32", reference: str | None = None) -> PreferenceLoss:
    """DPO on (prompt, chosen, rejected) token ids: chosen and rejected share one pass over the prompt."""
    batch = pack([Sample(prompt, (chosen, rejected)) for prompt, chosen, rejected in pairs])
    batch = batch.to(next(model.parameters()).device)
    ref = reference_logprobs(model, batch, precision, reference).sequence_logprobs
    with autocast(precision, _device(model)):
        policy = forward(model, batch).sequence_logprobs
    return dpo_loss(policy[0::2], policy[1::2], ref[0::2], ref[1::2], config,
                    chosen_lengths=batch.lengths[0::2], rejected_lengths=batch.lengths[1::2])


def kto_batch_loss(model: Any, samples: Sequence[tuple[TokenIds, TokenIds, bool]], config: KTOConfig,
                   precision: Precision = "fp32", partners: Sequence[TokenIds] | None = None,
                   mean: Callable[[torch.Tensor], torch.Tensor] | None = None,
                   reference: str | None = None) -> KTOLoss:
    """KTO on (prompt, completion, thumbs up?) samples.

    Each prompt is packed with its own completion and with a mismatched completion (by default the next
    sample's: `mismatched_pairs`) for the KL reference point, so the reference point costs no extra
    pass over the prompts. A batch of one with no `partners` has no mismatch: its reference point is 0.

    Data parallelism: a worker holding a shard of a larger batch passes the `partners` chosen over the
    whole batch and a `mean` that turns its shard's per-sample log-ratios into the whole batch's mean
    (an all-reduce), so every shard uses the reference point a single worker would.
    """
    if partners is None and len(samples) == 1:  # nothing to mismatch with: z0 = 0 (KTO's floor)
        prompt, completion, up = samples[0]
        batch = pack([Sample(prompt, (completion,))])
        ref = reference_logprobs(model, batch, precision, reference).sequence_logprobs
        with autocast(precision, _device(model)):
            policy = forward(model, batch).sequence_logprobs
        desirable = torch.tensor([up], dtype=torch.bool, device=policy.device)
        return kto_loss(policy, ref, desirable, policy.new_zeros(()), config)
    if partners is None:
        partners = [samples[j][1] for j in mismatched_pairs(len(samples))]
    if len(partners) != len(samples):
        raise ValueError(f"{len(partners)} partners for {len(samples)} samples: give one per sample")
    batch = pack([Sample(prompt, (completion, partner))
                  for (prompt, completion, _), partner in zip(samples, partners, strict=True)])
    ref = reference_logprobs(model, batch, precision, reference).sequence_logprobs
    with autocast(precision, _device(model)):
        policy = forward(model, batch).sequence_logprobs
    reference_point = kto_reference_point(policy[1::2].detach(), ref[1::2], mean)
    desirable = torch.tensor([up for _, _, up in samples], dtype=torch.bool, device=policy.device)
    return kto_loss(policy[0::2], ref[0::2], desirable, reference_point, config)


def critic_free_batch_loss(model: Any, groups: Sequence[tuple[TokenIds, Sequence[TokenIds]]],
                           advantages: torch.Tensor, config: CriticFreeConfig,
                           old_logprobs: torch.Tensor | None = None, keep: torch.Tensor | None = None,
                           precision: Precision = "fp32", reference: str | None = None) -> PolicyLoss:
    """GRPO/RLOO/REINFORCE++ on groups of answers: (prompt, its n answers). The n answers are branches
    after one copy of their prompt, so a prompt costs one pass however many answers it has.

    Answers are numbered group by group. `advantages` is one per answer, or (answers, longest) per
    token; `old_logprobs` (answers, longest), right-padded, are the sampling policy's (None: this
    policy's, detached, as on the first pass over fresh rollouts)."""
    batch = pack([Sample(prompt, tuple(answers)) for prompt, answers in groups])
    batch = batch.to(next(model.parameters()).device)
    ref = None
    if config.beta > 0:
        ref, _ = batch.padded(reference_logprobs(model, batch, precision, reference).token_logprobs)
    with autocast(precision, _device(model)):
        policy, mask = batch.padded(forward(model, batch).token_logprobs)
    old = policy.detach() if old_logprobs is None else old_logprobs.to(policy.device)
    return critic_free_loss(policy, old, advantages.to(policy.device), mask, config, ref, keep)


@dataclass(frozen=True)
class AnchorKL:
    total: torch.Tensor  # the sum over every anchor token of KL(reference || policy), differentiable
    tokens: int  # how many anchor tokens it sums over


def anchor_kl_batch_loss(model: Any, anchors: Sequence[tuple[TokenIds, TokenIds]],
                         precision: Precision = "fp32", reference: str | None = None) -> AnchorKL:
    """KL(reference || policy) of the next-token distributions at every answer position of the
    (prompt, answer) `anchors` (`online_rl.algos.anchor`), summed; the caller divides by the whole
    batch's anchor tokens (data-parallel shards each hold a part)."""
    batch = pack([Sample(prompt, (answer,)) for prompt, answer in anchors])
    batch = batch.to(next(model.parameters()).device)
    with torch.no_grad(), reference_policy(model, reference), autocast(precision, _device(model)):
        ref = next_token_logprobs(model, batch)
    with autocast(precision, _device(model)):
        policy = next_token_logprobs(model, batch)
    return AnchorKL(token_kl(policy, ref).sum(), int(batch.targets.numel()))


def implicit_rewards(model: Any, pairs: Sequence[tuple[TokenIds, TokenIds, TokenIds]],
                     thumbs: Sequence[tuple[TokenIds, TokenIds, bool]], beta: float,
                     precision: Precision = "fp32", reference: str | None = None) -> torch.Tensor:
    """Held-out evaluation, no autograd: per pair, beta * (log-ratio of chosen - log-ratio of rejected);
    per thumb, +-beta * log-ratio (+ for thumbs up), where log-ratio = log(pi / pi_ref). Positive means
    the policy moved the way the feedback asked, relative to the reference."""
    batch = pack([Sample(p, (c, r)) for p, c, r in pairs] + [Sample(p, (c,)) for p, c, _ in thumbs])
    batch = batch.to(next(model.parameters()).device)
    with torch.no_grad():
        ref = reference_logprobs(model, batch, precision, reference).sequence_logprobs
        with autocast(precision, _device(model)):
            policy = forward(model, batch).sequence_logprobs
    ratio = (policy - ref).float()
    n = 2 * len(pairs)
    signs = torch.tensor([1.0 if up else -1.0 for _, _, up in thumbs], device=ratio.device)
    return beta * torch.cat([ratio[0:n:2] - ratio[1:n:2], ratio[n:] * signs])


def reward_batch_loss(reward_model: RewardModel, pairs: Sequence[tuple[TokenIds, TokenIds, TokenIds]],
                      config: RewardModelConfig, precision: Precision = "fp32") -> PairLoss:
    """Bradley-Terry on (prompt, chosen, rejected) token ids, each prompt computed once."""
    batch = pack([Sample(prompt, (chosen, rejected)) for prompt, chosen, rejected in pairs])
    with autocast(precision, _device(reward_model)):
        chosen, rejected = reward_model.pair_rewards(batch)
    return bradley_terry_loss(chosen.float(), rejected.float(), config)


def reward_thumbs_loss(reward_model: RewardModel, thumbs: Sequence[tuple[TokenIds, TokenIds, bool]],
                       precision: Precision = "fp32") -> PairLoss:
    """The logistic loss of (prompt, completion, thumbs-up) token ids on the reward model's scores."""
    batch = pack([Sample(prompt, (completion,)) for prompt, completion, _ in thumbs])
    with autocast(precision, _device(reward_model)):
        rewards = reward_model(batch)
    up = torch.tensor([bool(u) for _, _, u in thumbs], device=rewards.device)
    return thumbs_loss(rewards.float(), up)


def _device(model: Any) -> str:
    return next(model.parameters()).device.type
