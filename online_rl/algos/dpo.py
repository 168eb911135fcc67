"""DPO (and IPO) on chosen/rejected pairs, from sequence log-probabilities under the policy and reference.

The loss sees only summed log-probabilities (and, for IPO, completion lengths); how they were computed
(packing, a shared prompt, the adapter disabled for the reference) is `online_rl.algos.logprobs`' business.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from online_rl.algos.config import DPOConfig

__all__ = ["PreferenceLoss", "dpo_loss"]


@dataclass(frozen=True)
class PreferenceLoss:
    """The batch loss, each pair's loss, and the implicit rewards beta * log(pi / pi_ref)."""

    loss: torch.Tensor
    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor

    @property
    def accuracy(self) -> torch.Tensor:
        """Share of pairs whose chosen answer has the higher implicit reward."""
        return (self.chosen_rewards > self.rejected_rewards).float().mean()

    @property
    def margin(self) -> torch.Tensor:
        return (self.chosen_rewards - self.rejected_rewards).mean()


def dpo_loss(chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, ref_chosen_logps: torch.Tensor,
             ref_rejected_logps: torch.Tensor, config: DPOConfig,
             chosen_lengths: torch.Tensor | None = None,
             rejected_lengths: torch.Tensor | None = None) -> PreferenceLoss:
    """-log sigmoid(beta * (chosen log-ratio - rejected log-ratio)) per pair (Rafailov et al., 2023).

    With label smoothing e the pair also pays e * -log sigmoid(-beta * delta) (conservative DPO).
    IPO (Azar et al., 2023) regresses the per-token-averaged delta onto 1 / (2 beta); it needs the
    completion lengths.
    """
    chosen_ratio = chosen_logps - ref_chosen_logps.detach()
    rejected_ratio = rejected_logps - ref_rejected_logps.detach()
    if config.loss == "sigmoid":
        delta = config.beta * (chosen_ratio - rejected_ratio)
        smoothing = config.label_smoothing
        losses = -(1.0 - smoothing) * F.logsigmoid(delta) - smoothing * F.logsigmoid(-delta)
    else:
        if chosen_lengths is None or rejected_lengths is None:
            raise ValueError("IPO averages over completion tokens: pass chosen_lengths and rejected_lengths")
        delta = chosen_ratio / chosen_lengths.clamp(min=1) - rejected_ratio / rejected_lengths.clamp(min=1)
        losses = (delta - 1.0 / (2.0 * config.beta)).square()
    return PreferenceLoss(
        loss=losses.mean(),
        losses=losses,
        chosen_rewards=config.beta * chosen_ratio.detach(),
        rejected_rewards=config.beta * rejected_ratio.detach(),
    )
