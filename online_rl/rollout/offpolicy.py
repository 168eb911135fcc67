"""The off-policy gate: the challenger's reward estimated from the champion's logged traffic.

Before any user sees the challenger, the champion's served completions (with their logged sequence
log-probabilities and the rewards users gave them) are re-weighted by how likely the challenger is
to produce the same completions: self-normalised importance sampling,

    V̂ = Σ w_i r_i / Σ w_i,   w_i = exp(log π_challenger(y_i | x_i) - log π_champion(y_i | x_i)),

with the effective sample size (Σ w)² / Σ w² saying how many logged samples the estimate is really
worth (sequence-level weights degenerate quickly when the two policies differ). Pure math.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["OffPolicyEstimate", "snips"]


@dataclass(frozen=True)
class OffPolicyEstimate:
    value: float  # estimated mean reward of the challenger on the champion's prompts
    logged_value: float  # the champion's own mean reward on the same samples
    effective_samples: float
    samples: int
    kl: float | None = None  # mean log(pi_behaviour / pi_target) over the samples, when computed


def snips(rewards: Sequence[float], target_logprobs: Sequence[float],
          behaviour_logprobs: Sequence[float]) -> OffPolicyEstimate:
    """Self-normalised importance-sampling estimate of the target policy's mean reward."""
    if not (len(rewards) == len(target_logprobs) == len(behaviour_logprobs)) or not rewards:
        raise ValueError("snips needs one reward, target and behaviour log-probability per logged sample")
    log_weights = [t - b for t, b in zip(target_logprobs, behaviour_logprobs, strict=True)]
    top = max(log_weights)  # stable: scale every weight by exp(-top); the ratio is unchanged
    weights = [math.exp(w - top) for w in log_weights]
    total = sum(weights)
    value = sum(w * r for w, r in zip(weights, rewards, strict=True)) / total
    effective = total * total / sum(w * w for w in weights)
    return OffPolicyEstimate(value, sum(rewards) / len(rewards), effective, len(rewards))
