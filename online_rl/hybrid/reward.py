"""The reward model that keeps learning from live preferences, as a Ray actor.

A `RewardModel` (the base with its own LoRA adapter and a scalar head) trained with the Bradley-Terry
loss on the preference pairs the stream delivers: every new pair joins a replay window, and each
`learn` call takes a few optimizer steps on minibatches drawn from it, so the model follows the
users as their preferences arrive. `score` gives one reward per (prompt, completion).
"""

from __future__ import annotations

import random
import time
from collections import deque

import torch

from online_rl.algos import RewardModel, Sample, pack
from online_rl.algos.batch import autocast, reward_batch_loss
from online_rl.trainer.spec import RewardSpec, adamw, build_lora, clipped_step

__all__ = ["RewardWorker"]

Pair = tuple[list[int], list[int], list[int]]


class RewardWorker:
    def __init__(self, spec: RewardSpec, threads: int = 1, device: str = "cpu") -> None:
        self.precision = spec.model.compute
        self.model = RewardModel(build_lora(spec.model, "reward", threads)[0]).to(device)
        self.device = device
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = adamw(self.parameters, spec.learning_rate)
        self.window: deque[Pair] = deque(maxlen=spec.window)
        self.batch = spec.batch
        self.loss_config = spec.loss
        self.random = random.Random(spec.model.seed)
        self.seen = 0

    def learn(self, pairs: list[Pair], steps: int) -> dict[str, float]:
        """Add `pairs` to the replay window and take `steps` Bradley-Terry steps on it."""
        start = time.perf_counter()
        self.window.extend(pairs)
        self.seen += len(pairs)
        metrics: dict[str, float] = {"reward_pairs_seen": float(self.seen)}
        if not self.window:
            return metrics
        self.model.train()
        for _ in range(steps):
            batch = self.random.sample(list(self.window), min(self.batch, len(self.window)))
            out = reward_batch_loss(self.model, batch, self.loss_config, self.precision)
            out.loss.backward()
            clipped_step(self.optimizer, self.parameters)
            metrics |= {"reward_loss": out.loss.item(), "reward_accuracy": out.accuracy.item()}
        return metrics | {"reward_step_s": time.perf_counter() - start}

    @torch.no_grad()
    def score(self, rollouts: list[tuple[list[int], list[int]]], chunk: int = 16) -> list[float]:
        """One reward per (prompt, completion)."""
        self.model.eval()
        out: list[float] = []
        for i in range(0, len(rollouts), chunk):
            batch = pack([Sample(p, (c,)) for p, c in rollouts[i:i + chunk]]).to(self.device)
            with autocast(self.precision, self.device.split(":")[0]):
                out += self.model(batch).float().tolist()
        return out
