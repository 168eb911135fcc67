"""The reward model that keeps learning from live preferences, as a Ray actor.

A `RewardModel` (the base with its own LoRA adapter and a scalar head) trained with the Bradley-Terry
loss on the preference pairs the stream delivers and with a logistic loss on its thumbs (a thumbs-up
scores above 0, a thumbs-down below, the two kinds weighing half each): every new pair or thumb joins
a replay window of its kind, and each `learn` call takes a few optimizer steps on minibatches drawn
from them, so the model follows the users as their feedback arrives. `score` gives one reward per
(prompt, completion).
"""

from __future__ import annotations

import random
import time
from collections import deque

import torch

from online_rl.algos import RewardModel, Sample, pack
from online_rl.algos.batch import autocast, reward_batch_loss, reward_thumbs_loss
from online_rl.trainer.spec import RewardSpec, adamw, build_lora, clipped_step

__all__ = ["RewardWorker"]

Pair = tuple[list[int], list[int], list[int]]
Thumb = tuple[list[int], list[int], bool]  # prompt, completion, thumbs-up


class RewardWorker:
    def __init__(self, spec: RewardSpec, threads: int = 1, device: str = "cpu") -> None:
        self.precision = spec.model.compute
        self.model = RewardModel(build_lora(spec.model, "reward", threads)[0]).to(device)
        self.device = device
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = adamw(self.parameters, spec.learning_rate)
        self.window: deque[Pair] = deque(maxlen=spec.window)
        self.thumbs: deque[Thumb] = deque(maxlen=spec.window)
        self.batch = spec.batch
        self.loss_config = spec.loss
        self.random = random.Random(spec.model.seed)
        self.seen = 0
        self.thumbs_seen = 0

    def learn(self, pairs: list[Pair], steps: int, thumbs: list[Thumb] | None = None) -> dict[str, float]:
        """Add `pairs` and `thumbs` to their replay windows and take `steps` steps on both: each a
        minibatch of pairs (Bradley-Terry) and one of thumbs (logistic), their losses summed."""
        start = time.perf_counter()
        self.window.extend(pairs)
        self.thumbs.extend(thumbs or ())
        self.seen += len(pairs)
        self.thumbs_seen += len(thumbs or ())
        metrics: dict[str, float] = {"reward_pairs_seen": float(self.seen),
                                     "reward_thumbs_seen": float(self.thumbs_seen)}
        if not self.window and not self.thumbs:
            return metrics
        self.model.train()
        for _ in range(steps):
            loss = None
            if self.window:
                batch = self.random.sample(list(self.window), min(self.batch, len(self.window)))
                out = reward_batch_loss(self.model, batch, self.loss_config, self.precision)
                loss = out.loss
                metrics |= {"reward_loss": out.loss.item(), "reward_accuracy": out.accuracy.item()}
            if self.thumbs:
                rows = self.random.sample(list(self.thumbs), min(self.batch, len(self.thumbs)))
                judged = reward_thumbs_loss(self.model, rows, self.precision)
                loss = judged.loss if loss is None else loss + judged.loss
                metrics |= {"reward_thumbs_loss": judged.loss.item(),
                            "reward_thumbs_accuracy": judged.accuracy.item()}
            assert loss is not None
            loss.backward()
            clipped_step(self.optimizer, self.parameters)
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
