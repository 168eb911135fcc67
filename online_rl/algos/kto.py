"""KTO for unpaired thumbs up/down (Ethayarajh et al., 2024), the commonest live signal.

A thumbs-up pulls beta * log(pi / pi_ref) above a reference point z0, a thumbs-down pushes it below.
z0 is an estimate of KL(pi || pi_ref), taken on mismatched (prompt, completion) pairs of the same batch,
never differentiated, and floored at 0. Pure functions on sequence log-probabilities.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from online_rl.algos.config import KTOConfig

__all__ = ["KTOLoss", "balanced_weights", "kto_loss", "kto_reference_point", "mismatched_pairs"]


@dataclass(frozen=True)
class KTOLoss:
    loss: torch.Tensor
    losses: torch.Tensor  # per sample, weighted, in the batch's order
    rewards: torch.Tensor  # beta * log(pi / pi_ref) per sample
    reference_point: torch.Tensor


def mismatched_pairs(batch_size: int) -> list[int]:
    """For sample i, the sample whose completion is paired with i's prompt for the KL estimate.

    Each sample takes the next one's completion (the last takes the first's), so no prompt keeps its own.
    """
    if batch_size < 2:
        raise ValueError("the KTO reference point needs at least 2 samples per batch to mismatch")
    return [(index + 1) % batch_size for index in range(batch_size)]


def kto_reference_point(kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor,
                        mean: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """z0: the batch mean of log(pi / pi_ref) on mismatched pairs, detached and floored at 0.

    `mean` replaces the local mean, e.g. by one over every data-parallel shard of the batch."""
    log_ratios = (kl_logps - ref_kl_logps).detach()
    return (log_ratios.mean() if mean is None else mean(log_ratios)).clamp(min=0.0)


def kto_loss(logps: torch.Tensor, ref_logps: torch.Tensor, desirable: torch.Tensor,
             reference_point: torch.Tensor, config: KTOConfig) -> KTOLoss:
    """Per sample: w_d * (1 - sigmoid(beta * (r - z0))) for thumbs-up, w_u * (1 - sigmoid(beta * (z0 - r)))
    for thumbs-down, with r = log(pi / pi_ref); the loss is their mean."""
    desirable = desirable.to(torch.bool)
    log_ratio = logps - ref_logps.detach()
    z0 = reference_point.detach()
    up = config.desirable_weight * (1.0 - torch.sigmoid(config.beta * (log_ratio - z0)))
    down = config.undesirable_weight * (1.0 - torch.sigmoid(config.beta * (z0 - log_ratio)))
    losses = torch.where(desirable, up, down)
    return KTOLoss(losses.mean(), losses, config.beta * log_ratio.detach(), z0)


def balanced_weights(ups: int, downs: int, config: KTOConfig, cap: float) -> KTOConfig:
    """`config` with the rarer label's weight raised so weight x count is the same for thumbs-up and
    thumbs-down (`ups`, `downs`: the thumbs trained so far), by at most `cap`; the commoner label keeps
    its weight. The KTO paper keeps desirable_weight * ups / (undesirable_weight * downs) near 1 (within
    [1, 4/3]): without it a taste its users rarely meet gives mostly thumbs-down, which only push away."""
    if cap < 1:
        raise ValueError(f"kto balance cap={cap} must be >= 1 (1: no balancing), e.g. 10")
    up_mass, down_mass = config.desirable_weight * ups, config.undesirable_weight * downs
    if up_mass <= 0 or down_mass <= 0 or up_mass == down_mass:  # one label unseen: nothing to balance
        return config
    if up_mass < down_mass:
        return replace(config, desirable_weight=config.desirable_weight * min(down_mass / up_mass, cap))
    return replace(config, undesirable_weight=config.undesirable_weight * min(up_mass / down_mass, cap))
