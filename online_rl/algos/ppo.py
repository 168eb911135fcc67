"""PPO for language-model tokens: rewards with a KL penalty, GAE, the clipped losses, the KL controller.

Live traffic was sampled by the served version (the behaviour policy), not by the policy being trained,
so the policy loss carries a truncated importance weight pi_old / pi_behaviour on top of PPO's clipped
ratio pi / pi_old (decoupled PPO; the truncation keeps one unlikely sample from dominating a batch).

Every function takes (batch, tokens) tensors with a mask of real completion tokens, right-padded.
Pure torch: no model, no data loading.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from online_rl.algos.config import KLControlConfig, KLEstimator, PPOConfig
from online_rl.algos.ops import aggregate, masked, masked_mean, masked_whiten

__all__ = [
    "AdaptiveKLController",
    "Advantages",
    "PolicyLoss",
    "ValueLoss",
    "entropy_from_logits",
    "gae",
    "kl_penalty",
    "policy_loss",
    "ppo_advantages",
    "token_rewards",
    "value_loss",
    "whiten_advantages",
]


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled tokens' log-probabilities.

    k1 = log(pi/pi_ref) (unbiased, can be negative); k2 = (log ratio)^2 / 2;
    k3 = pi_ref/pi - 1 - log(pi_ref/pi) (unbiased, never negative, low variance; Schulman 2020).
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        # Clamped so a token the reference finds impossible cannot overflow the exponential.
        negative = (-log_ratio).clamp(-20.0, 20.0)
        return torch.exp(negative) - 1.0 - negative
    raise ValueError(f"unknown KL estimator {estimator!r}: use k1, k2 or k3")


def token_rewards(scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """Rewards per token: -kl_coef * KL on every token, plus the sequence's score on its last token."""
    rewards = -kl_coef * masked(kl.detach(), mask)
    lengths = mask.long().sum(-1)
    last = (lengths - 1).clamp(min=0)
    has_tokens = lengths > 0
    rows = torch.arange(rewards.shape[0], device=rewards.device)
    rewards[rows[has_tokens], last[has_tokens]] += scores[has_tokens].detach().float()
    return rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and returns (targets of the value head).

    delta_t = r_t + gamma * V_{t+1} - V_t, A_t = delta_t + gamma * lam * A_{t+1}; a sequence ends at its
    last real token (the value after it is 0). Returns (advantages, returns), zero on padding.
    """
    weights = mask.float()
    values = masked(values.detach(), mask)
    rewards = masked(rewards.detach(), mask)
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(values[:, 0])
    next_value = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        # The step after t is real only if token t + 1 is; otherwise t ended the sequence.
        following = weights[:, t + 1] if t + 1 < values.shape[1] else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value * following - values[:, t]
        running = delta + gamma * lam * running * following
        advantages[:, t] = running * weights[:, t]
        next_value = values[:, t]
    return advantages, (advantages + values) * weights


@dataclass(frozen=True)
class PolicyLoss:
    """The clipped surrogate and what to watch while it trains."""

    loss: torch.Tensor
    clip_fraction: torch.Tensor  # share of tokens whose ratio was clipped
    approx_kl: torch.Tensor  # k3 estimate of KL(pi_old || pi) over the batch's tokens
    truncated_fraction: torch.Tensor  # share of tokens whose behaviour weight hit the cap
    entropy: torch.Tensor | None = None


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, config: PPOConfig,
                behaviour_logprobs: torch.Tensor | None = None,
                entropy: torch.Tensor | None = None) -> PolicyLoss:
    """PPO's clipped surrogate, weighted by min(pi_old / pi_behaviour, cap) when the samples came
    from another policy; minus `entropy_coef` times the mean entropy when `entropy` is given."""
    log_ratio = logprobs.float() - old_logprobs.detach().float()
    advantages = advantages.detach().float()
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high)
    per_token = torch.maximum(unclipped, clipped)
    truncated = torch.zeros_like(per_token, dtype=torch.bool)
    if behaviour_logprobs is not None:
        weight = torch.exp((old_logprobs - behaviour_logprobs).detach().clamp(max=20.0))
        truncated = weight > config.behaviour_cap
        per_token = per_token * weight.clamp(max=config.behaviour_cap)
    loss = aggregate(per_token, mask, config.aggregation)
    mean_entropy = None
    if entropy is not None:
        mean_entropy = aggregate(entropy, mask, config.aggregation)
        loss = loss - config.entropy_coef * mean_entropy
    with torch.no_grad():
        clip_fraction = masked_mean((clipped > unclipped).float(), mask)
        # k3 for KL(pi_old || pi) on tokens sampled from pi_old: r - 1 - log r with r = pi / pi_old
        approx_kl = masked_mean(torch.expm1(log_ratio.clamp(-20.0, 20.0)) - log_ratio, mask)
        truncated_fraction = masked_mean(truncated.float(), mask)
    return PolicyLoss(loss, clip_fraction, approx_kl, truncated_fraction, mean_entropy)


@dataclass(frozen=True)
class ValueLoss:
    loss: torch.Tensor
    clip_fraction: torch.Tensor


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               config: PPOConfig) -> ValueLoss:
    """Half the larger of the squared errors of the new and the clipped value (PPO's value clipping),
    times `value_coef`."""
    values, returns = values.float(), returns.detach().float()
    old_values = old_values.detach().float()
    clipped = old_values + (values - old_values).clamp(-config.value_clip, config.value_clip)
    unclipped_error = (values - returns).square()
    clipped_error = (clipped - returns).square()
    loss = 0.5 * aggregate(torch.maximum(unclipped_error, clipped_error), mask, config.aggregation)
    with torch.no_grad():
        clip_fraction = masked_mean((clipped_error > unclipped_error).float(), mask)
    return ValueLoss(config.value_coef * loss, clip_fraction)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last dimension."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return -(log_probs.exp() * log_probs).sum(-1)


def whiten_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Advantages with zero mean and unit variance over the batch's real tokens."""
    return masked_whiten(advantages, mask)


@dataclass(frozen=True)
class Advantages:
    """What one batch of rollouts gives the PPO update."""

    advantages: torch.Tensor  # (batch, tokens), whitened when the config says so
    returns: torch.Tensor  # (batch, tokens) targets of the value head
    rewards: torch.Tensor  # (batch, tokens) the KL-penalised token rewards
    kl: torch.Tensor  # (batch, tokens) the per-token KL estimate to the reference
    sequence_kl: float  # mean over sequences of the summed KL (what the KL controller tracks)


def ppo_advantages(scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                   values: torch.Tensor, mask: torch.Tensor, config: PPOConfig, kl_coef: float) -> Advantages:
    """Steps 1-2 of PPO for a batch: KL-penalised token rewards, GAE, optional whitening.

    `logprobs` are those of the policy that generated the tokens (pi_old), `values` the value head's
    at the same positions, all (batch, tokens) right-padded as `mask`; `kl_coef` comes from an
    `AdaptiveKLController` built from `config.kl`.
    """
    kl = kl_penalty(logprobs.detach().float(), ref_logprobs.detach().float(), config.kl_estimator)
    rewards = token_rewards(scores, kl, mask, kl_coef)
    advantages, returns = gae(rewards, values, mask, config.gamma, config.lam)
    if config.whiten_advantages:
        advantages = whiten_advantages(advantages, mask)
    sequence_kl = float(masked(kl, mask).sum(-1).mean())
    return Advantages(advantages, returns, rewards, masked(kl, mask), sequence_kl)


class AdaptiveKLController:
    """The KL coefficient, moved so the observed KL tracks `target` (fixed when there is no target).

    coef *= 1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon after each batch of n samples.
    """

    def __init__(self, config: KLControlConfig) -> None:
        self.config = config
        self.value = config.coef

    def update(self, observed_kl: float, samples: int) -> float:
        if self.config.target is not None:
            error = min(max(observed_kl / self.config.target - 1.0, -0.2), 0.2)
            self.value *= 1.0 + error * samples / self.config.horizon
        return self.value
