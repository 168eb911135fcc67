"""A scalar reward model learned from preference pairs (Bradley-Terry), for PPO on fresh rollouts.

`RewardModel` puts a linear head on a causal LM's backbone (its own LoRA adapter, or a frozen copy)
and reads it at each completion's last token. `bradley_terry_loss` is the pure loss. Nothing here
knows where the pairs came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from online_rl.algos.config import RewardModelConfig
from online_rl.algos.logprobs import PackedBatch, hidden_states

__all__ = ["PairLoss", "RewardModel", "bradley_terry_loss", "thumbs_loss"]


@dataclass(frozen=True)
class PairLoss:
    loss: torch.Tensor
    accuracy: torch.Tensor  # share of pairs ranked the right way


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, config: RewardModelConfig) -> PairLoss:
    """-log sigmoid(r_chosen - r_rejected - margin), plus center_coef * mean((r_chosen + r_rejected)^2)."""
    loss = -F.logsigmoid(chosen - rejected - config.margin).mean()
    if config.center_coef:
        loss = loss + config.center_coef * (chosen + rejected).square().mean()
    with torch.no_grad():
        accuracy = (chosen > rejected).float().mean()
    return PairLoss(loss, accuracy)


def thumbs_loss(rewards: torch.Tensor, up: torch.Tensor) -> PairLoss:
    """Logistic loss of thumbs on their scalar rewards: -log sigmoid(r) for a thumbs-up, -log sigmoid(-r)
    for a thumbs-down, the two kinds weighing half each when both are present (users who like a tenth of
    what they see would otherwise teach "everything is bad"). `accuracy`: the share whose reward has the
    thumb's sign."""
    signs = up.to(rewards.dtype) * 2 - 1
    losses = -F.logsigmoid(signs * rewards)
    kinds = [losses[up], losses[~up]]
    loss = torch.stack([k.mean() for k in kinds if k.numel()]).mean()
    with torch.no_grad():
        accuracy = ((signs * rewards) > 0).float().mean()
    return PairLoss(loss, accuracy)


class RewardModel(nn.Module):
    """A causal LM's backbone with a scalar head, read at the last token of each completion."""

    def __init__(self, backbone: Any, hidden_size: int | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        size = hidden_size or backbone.config.hidden_size
        self.head = nn.Linear(size, 1)
        # A small start keeps the first rewards near 0, so the first updates are not dominated by noise.
        nn.init.normal_(self.head.weight, std=1.0 / (size + 1) ** 0.5)
        nn.init.zeros_(self.head.bias)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """One reward per completion of `batch`."""
        batch = batch.to(self.head.weight.device)
        hidden = hidden_states(self.backbone, batch)[batch.last_token_at]
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)

    def pair_rewards(self, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen, rejected) rewards of a batch packed from pairs (completions in that order)."""
        rewards = self(batch)
        return rewards[0::2], rewards[1::2]
