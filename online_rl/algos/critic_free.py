"""Critic-free advantages: GRPO, RLOO and REINFORCE++, and the clipped loss they train with.

These estimators need no value head. GRPO and RLOO compare each answer with the other answers to the
same prompt (a *group*), so the rollout flow samples n answers per prompt; REINFORCE++ compares each
token's return with the whole batch. Groups are given as an id per answer, not as a reshape: a group
may hold any number of answers (live traffic rarely gives every prompt the same n), and answers of
one group need not be adjacent.

Formulas (r_i the answer's scalar reward, G(i) its group, n_g the group's size):

- GRPO:      A_i = (r_i - mean_{G(i)} r) / (std + eps); std over the group ("group"), over the whole
             batch ("batch", the Lite-PPO variant) or no division ("none", Dr. GRPO).
- RLOO:      A_i = r_i - (sum_{G(i)} r - r_i) / (n_g - 1): the mean of the *other* answers.
- REINFORCE++: token rewards -beta * KL_t plus r_i on the last token; returns
             G_t = sum_{s>=t} gamma^(s-t) r_s; A = whiten(G) over all the batch's tokens. The baseline
             variant (REINFORCE++-baseline) first centres r_i on its group's mean.

The loss is PPO's clipped surrogate on the answer's advantage at every token (DAPO's clip-higher
allows clip_high > clip_low), plus an optional beta * k3 KL to the reference inside the loss (GRPO's
way, by default weighed by the token's ratio as DeepSeek-V3.2 does; RLOO and REINFORCE++ put the KL in
the reward instead). Pure torch, no model, no data loading.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from online_rl.algos.config import CriticFreeConfig
from online_rl.algos.ops import masked, masked_mean, masked_whiten
from online_rl.algos.ppo import PolicyLoss, kl_penalty

__all__ = [
    "CriticFreeBatch",
    "critic_free_advantages",
    "critic_free_loss",
    "group_stats",
    "grpo_advantages",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "zero_variance_groups",
]


def _group_index(groups: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense 0..k-1 index per answer for arbitrary group ids, and k."""
    _, index = torch.unique(groups, return_inverse=True)
    return index, int(index.max()) + 1 if index.numel() else 0


def group_stats(rewards: torch.Tensor,
                groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per answer: its group's mean reward, its group's standard deviation (Bessel-corrected, 0 for a
    group of one) and its group's size."""
    rewards = rewards.float()
    index, k = _group_index(groups)
    count = torch.zeros(k).index_add_(0, index, torch.ones_like(rewards))
    total = torch.zeros(k).index_add_(0, index, rewards)
    mean = total / count
    squares = torch.zeros(k).index_add_(0, index, (rewards - mean[index]) ** 2)
    std = torch.where(count > 1, (squares / (count - 1).clamp(min=1.0)).sqrt(), 0.0)
    return mean[index], std[index], count[index]


def zero_variance_groups(rewards: torch.Tensor, groups: torch.Tensor, atol: float = 1e-8) -> torch.Tensor:
    """True for answers whose group's rewards are all equal (DAPO drops these: they teach nothing and
    only dilute the batch)."""
    _, std, _ = group_stats(rewards, groups)
    return std <= atol


def grpo_advantages(rewards: torch.Tensor, groups: torch.Tensor, scale: str = "group",
                    eps: float = 1e-4) -> torch.Tensor:
    """GRPO's group-normalised advantage per answer (see the module's docstring)."""
    rewards = rewards.float()
    mean, group_std, _ = group_stats(rewards, groups)
    centred = rewards - mean
    if scale == "none":
        return centred
    if scale == "group":
        return centred / (group_std + eps)
    if scale == "batch":
        std = rewards.std() if rewards.numel() > 1 else torch.zeros(())
        return centred / (std + eps)
    raise ValueError(f"unknown GRPO scale {scale!r}: use group, batch or none")


def rloo_advantages(rewards: torch.Tensor, groups: torch.Tensor, normalize: bool = False,
                    eps: float = 1e-4) -> torch.Tensor:
    """RLOO's leave-one-out advantage per answer; 0 for an answer alone in its group. With
    `normalize`, whitened over the batch."""
    rewards = rewards.float()
    mean, _, count = group_stats(rewards, groups)
    others = (mean * count - rewards) / (count - 1).clamp(min=1.0)
    advantages = torch.where(count > 1, rewards - others, 0.0)
    if normalize and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + eps)
    return advantages


def reinforce_pp_advantages(rewards: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                            mask: torch.Tensor, kl_coef: float, groups: torch.Tensor | None = None,
                            gamma: float = 1.0, kl_estimator: str = "k1") -> torch.Tensor:
    """REINFORCE++'s token advantages (batch, tokens): KL-penalised token rewards, their returns,
    whitened over the batch's real tokens. With `groups`, the baseline variant."""
    scores = rewards.float()
    if groups is not None:
        scores = scores - group_stats(scores, groups)[0]
    kl = kl_penalty(logprobs.detach().float(), ref_logprobs.detach().float(), kl_estimator)  # type: ignore[arg-type]
    token = -kl_coef * masked(kl, mask)
    lengths = mask.long().sum(-1)
    rows = torch.arange(token.shape[0])
    present = lengths > 0
    token[rows[present], (lengths - 1)[present]] += scores[present]
    returns = torch.zeros_like(token)
    running = torch.zeros_like(token[:, 0])
    for t in reversed(range(token.shape[1])):
        running = token[:, t] + gamma * running
        returns[:, t] = running
    return masked_whiten(returns, mask)


@dataclass(frozen=True)
class CriticFreeBatch:
    """Advantages for one batch of answers, and which answers to train on."""

    advantages: torch.Tensor  # (batch,) for GRPO/RLOO, (batch, tokens) for REINFORCE++
    keep: torch.Tensor  # (batch,) bool: False for answers dropped (zero-variance groups)
    zero_variance_fraction: float


def critic_free_advantages(config: CriticFreeConfig, rewards: torch.Tensor, groups: torch.Tensor,
                           logprobs: torch.Tensor | None = None, ref_logprobs: torch.Tensor | None = None,
                           mask: torch.Tensor | None = None) -> CriticFreeBatch:
    """The advantages `config.estimator` gives `rewards` (one per answer, grouped by `groups`).
    REINFORCE++ also needs the answers' token log-probs under the sampling and reference policies."""
    flat = zero_variance_groups(rewards, groups)
    # only where a flat group's advantages are all 0: REINFORCE++'s token advantages (KL, whitening) and
    # RLOO's with a KL in the reward are not, so their groups are kept (as are groups of one)
    droppable = config.estimator == "grpo" or (config.estimator == "rloo" and config.kl_coef == 0)
    keep = ~flat if config.drop_zero_variance and droppable else torch.ones_like(flat)
    needs_logprobs = (config.estimator.startswith("reinforce++")
                      or (config.estimator == "rloo" and config.kl_coef > 0))
    if needs_logprobs and (logprobs is None or ref_logprobs is None or mask is None):
        raise ValueError(f"{config.estimator} with a KL in the reward needs logprobs, ref_logprobs and mask")
    if config.estimator == "grpo":
        advantages = grpo_advantages(rewards, groups, config.scale_rewards, config.eps)
    elif config.estimator == "rloo":
        if config.kl_coef > 0:  # the answer's summed k1 KL comes off its reward before the baseline
            assert logprobs is not None and ref_logprobs is not None and mask is not None
            kl = masked(logprobs.detach().float() - ref_logprobs.detach().float(), mask).sum(-1)
            rewards = rewards.float() - config.kl_coef * kl
        advantages = rloo_advantages(rewards, groups, config.normalize, config.eps)
    else:
        assert logprobs is not None and ref_logprobs is not None and mask is not None
        advantages = reinforce_pp_advantages(rewards, logprobs, ref_logprobs, mask, config.kl_coef,
                                             groups if config.estimator == "reinforce++-baseline" else None,
                                             config.gamma)
    return CriticFreeBatch(advantages, keep, float(flat.float().mean()) if flat.numel() else 0.0)


def critic_free_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                     mask: torch.Tensor, config: CriticFreeConfig, ref_logprobs: torch.Tensor | None = None,
                     keep: torch.Tensor | None = None) -> PolicyLoss:
    """The clipped surrogate on per-answer (batch,) or per-token (batch, tokens) advantages, with
    beta * k3 KL to `ref_logprobs` per token when `config.beta` > 0, reduced by `config.loss_aggregation`:
    `seq-mean-token-mean` (GRPO's paper), `token-mean` (DAPO's token-level loss) or `seq-mean-token-sum-norm`
    (Dr. GRPO: summed tokens over batch x `max_tokens`). `keep` drops answers (zero-variance groups)."""
    rows = per_answer_rows = float(logprobs.shape[0])
    if keep is not None:
        mask = mask.bool() & keep.bool().unsqueeze(-1)
        rows = float(keep.bool().sum())
    log_ratio = masked(logprobs.float() - old_logprobs.detach().float(), mask)
    advantages = advantages.detach().float()
    if config.ratio_level == "sequence":
        return _sequence_loss(log_ratio, advantages, mask, config, rows)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if config.beta > 0:
        if ref_logprobs is None:
            raise ValueError("critic_free_loss: beta > 0 needs ref_logprobs")
        kl = kl_penalty(logprobs.float(), ref_logprobs.float(), "k3")
        per_token = per_token + config.beta * (kl * ratio if config.kl_ratio_correction else kl)
    weights = mask.float()
    if config.loss_aggregation == "token-mean":
        loss = masked(per_token, mask).sum() / weights.sum().clamp(min=1.0)
    elif config.loss_aggregation == "seq-mean-token-mean":
        loss = (masked(per_token, mask).sum(-1) / weights.sum(-1).clamp(min=1.0)).sum() / max(rows, 1.0)
    else:  # seq-mean-token-sum-norm: a constant normaliser, so no answer's length changes its weight
        loss = masked(per_token, mask).sum() / (per_answer_rows * config.max_tokens)
    with torch.no_grad():
        clip_fraction = masked_mean((clipped > unclipped).float(), mask)
        approx_kl = masked_mean(torch.expm1(log_ratio.clamp(-20.0, 20.0)) - log_ratio, mask)
    return PolicyLoss(loss, clip_fraction, approx_kl, torch.zeros(()))


def _sequence_loss(log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                   config: CriticFreeConfig, rows: float) -> PolicyLoss:
    """One clipped term per answer on its whole ratio exp(sum of token log-ratios), mean over answers."""
    if advantages.dim() != 1:
        raise ValueError("ratio_level 'sequence' takes one advantage per answer, not per token")
    present = mask.bool().any(-1)
    sequence = log_ratio.sum(-1)
    ratio = torch.exp(sequence.clamp(-20.0, 20.0))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high)
    per_answer = torch.where(present, torch.maximum(unclipped, clipped), 0.0)
    loss = per_answer.sum() / max(rows, 1.0)
    with torch.no_grad():
        kept = present.float()
        clip_fraction = ((clipped > unclipped).float() * kept).sum() / kept.sum().clamp(min=1.0)
        approx_kl = (((torch.expm1(sequence.clamp(-20.0, 20.0)) - sequence) * kept).sum()
                     / kept.sum().clamp(min=1.0))
    return PolicyLoss(loss, clip_fraction, approx_kl, torch.zeros(()))
