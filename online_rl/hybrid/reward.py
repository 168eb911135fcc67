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
from typing import Any

import torch

from online_rl.algos import RewardModel, RewardModelConfig, Sample, pack
from online_rl.algos.batch import autocast, reward_batch_loss
from online_rl.algos.policy import LoraSpec, lora_policy

__all__ = ["RewardWorker"]

Pair = tuple[list[int], list[int], list[int]]


class RewardWorker:
    def __init__(self, model_dir: str, config: dict[str, Any], threads: int = 1, device: str = "cpu") -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(max(1, threads))
        torch.manual_seed(config["seed"] + 2)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        spec = LoraSpec(rank=config["lora_rank"], alpha=config["lora_alpha"],
                        targets=tuple(config["lora_targets"]))
        self.precision = config.get("precision", "fp32")
        self.model = RewardModel(lora_policy(base, spec, self.precision)).to(device)
        self.device = device
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad],
                                           lr=config["reward_learning_rate"])
        self.window: deque[Pair] = deque(maxlen=config["reward_window"])
        self.batch = config["reward_batch"]
        self.loss_config = RewardModelConfig(center_coef=0.01)
        self.random = random.Random(config["seed"])
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
            torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
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
