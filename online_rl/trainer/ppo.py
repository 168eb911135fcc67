"""PPO's advantage phase for the trainer: from the workers' per-token lists to advantages and returns.

The policy ranks score the rollouts (pi_old and reference log-probs), the critic values them, and this
module turns those ragged lists into right-padded tensors, runs `online_rl.algos.ppo_advantages`
(KL-penalised token rewards, GAE, whitening over the whole batch) and hands back ragged lists for the
update. Pure: no Ray, no bus, no MLflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from online_rl.algos import PPOConfig, ppo_advantages
from online_rl.trainer.samples import Rollout

__all__ = ["PPOAdvantages", "advantages_for"]


@dataclass(frozen=True)
class PPOAdvantages:
    advantages: list[list[float]]
    returns: list[list[float]]
    sequence_kl: float  # mean summed KL to the reference per rollout
    mean_reward: float


def _padded(rows: Sequence[Sequence[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(row) for row in rows)
    values = torch.zeros(len(rows), width)
    mask = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        values[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
        mask[i, : len(row)] = 1.0
    return values, mask


def advantages_for(rollouts: Sequence[Rollout], old: Sequence[Sequence[float]],
                   ref: Sequence[Sequence[float]], values: Sequence[Sequence[float]], config: PPOConfig,
                   kl_coef: float) -> PPOAdvantages:
    """GAE advantages and returns per rollout token; each rollout's reward lands on its last token."""
    old_padded, mask = _padded(old)
    ref_padded, _ = _padded(ref)
    values_padded, _ = _padded(values)
    scores = torch.tensor([reward for _, _, _, reward in rollouts], dtype=torch.float32)
    out = ppo_advantages(scores, old_padded, ref_padded, values_padded, mask, config, kl_coef)
    lengths = [len(row) for row in old]
    return PPOAdvantages(
        advantages=[out.advantages[i, :n].tolist() for i, n in enumerate(lengths)],
        returns=[out.returns[i, :n].tolist() for i, n in enumerate(lengths)],
        sequence_kl=out.sequence_kl, mean_reward=float(scores.mean()),
    )
