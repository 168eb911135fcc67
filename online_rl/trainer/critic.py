"""PPO's critic: a value model (the base with its own LoRA adapter and a linear value head).

Runs inside a Ray actor that the controller places next to the policy workers or on its own bundle.
It predicts a value for every completion token (from the hidden state that predicts the token, as the
policy sees it) and learns them with PPO's clipped value loss. It knows nothing about the policy, the
bus or MLflow; the advantages that use its values are computed by the controller.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from online_rl.algos import Sample, hidden_states, pack, value_loss
from online_rl.algos.batch import autocast
from online_rl.algos.policy import trainable_parameters
from online_rl.trainer.spec import CriticSpec, adamw, build_lora, clipped_step, set_learning_rate

__all__ = ["CriticWorker"]

_HEAD = "value_head."


class CriticWorker:
    """The value model and its AdamW optimizer."""

    def __init__(self, spec: CriticSpec, threads: int = 1, device: str = "cpu") -> None:
        self.spec = spec
        self.precision = spec.model.compute
        self.device = device
        self.model, base_config = build_lora(spec.model, "critic", threads)
        self.model.to(device)
        self.head = torch.nn.Linear(base_config.hidden_size, 1).to(device)
        torch.nn.init.zeros_(self.head.weight)  # values start at 0: the first advantages are the rewards
        torch.nn.init.zeros_(self.head.bias)
        self.parameters = trainable_parameters(self.model) | {
            _HEAD + name: p for name, p in self.head.named_parameters()}
        self.optimizer = adamw(self.parameters.values(), spec.learning_rate)
        self.ppo = spec.ppo

    def _values(self, rollouts: list[Any]) -> tuple[Any, torch.Tensor]:
        batch = pack([Sample(prompt, (completion,)) for prompt, completion, _, _ in rollouts]).to(self.device)
        with autocast(self.precision, self.device.split(":")[0]):
            hidden = hidden_states(self.model, batch)[batch.predict_at]
        return batch, self.head(hidden.float()).squeeze(-1)

    def values(self, rollouts: list[Any]) -> list[list[float]]:
        """A value for every completion token of every rollout, no autograd."""
        if not rollouts:
            return []
        with torch.no_grad():
            batch, values = self._values(rollouts)
        return [v.tolist() for v in values.split(batch.lengths.tolist())]

    def train_step(self, rollouts: list[Any], returns: list[list[float]],
                   old_values: list[list[float]]) -> dict[str, float]:
        """`ppo_epochs` steps of the clipped value loss towards the returns."""
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        for _epoch in range(self.spec.epochs):
            batch, values = self._values(rollouts)
            padded, mask = batch.padded(values)
            target, _ = batch.padded(torch.tensor([x for row in returns for x in row], device=self.device))
            old, _ = batch.padded(torch.tensor([x for row in old_values for x in row], device=self.device))
            loss = value_loss(padded, old, target, mask, self.ppo)
            loss.loss.backward()
            clipped_step(self.optimizer, self.parameters.values())
            metrics = {"value_loss": loss.loss.item(), "value_clip_fraction": loss.clip_fraction.item()}
        return metrics | {"critic_step_s": time.perf_counter() - start}

    def snapshot(self) -> dict[str, Any]:
        return {"adapter": {name: p.detach().cpu().clone() for name, p in self.parameters.items()},
                "optimizer": self.optimizer.state_dict()}

    def restore(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for name, parameter in self.parameters.items():
                parameter.copy_(state["adapter"][name])
        self.optimizer.load_state_dict(state["optimizer"])
        set_learning_rate(self.optimizer, self.spec.learning_rate)
