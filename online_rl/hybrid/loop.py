"""Colocated PPO: the classic RLHF loop on the HybridEngine, driven by a reward model that keeps
learning from live preferences.

Each `step`: the reward model learns from the preference pairs that arrived; the actor devices switch
to generation (only the adapter moves after the first time), sample completions for prompts drawn
from the recent ones on the stream, switch back to training; the reward model scores the
completions, the actors give the policy's and the reference's log-probs, the critic its values;
GAE on KL-penalised rewards gives the advantages; the actors and the critic take their PPO steps; the
KL coefficient adapts towards its target. The driver holds no weights.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from online_rl.algos import AdaptiveKLController
from online_rl.hybrid.group import HybridGroup
from online_rl.trainer.ppo import advantages_for, ppo_config

if TYPE_CHECKING:
    from online_rl.config import Settings

__all__ = ["ColocatedPPO", "worker_config"]

logger = logging.getLogger(__name__)

Pair = tuple[list[int], list[int], list[int]]


def worker_config(settings: Settings) -> dict[str, Any]:
    """What the hybrid, critic and reward actors need: the adapter's shape from `trainer`, the rest from
    `hybrid`."""
    trainer, hybrid = settings.trainer, settings.hybrid
    return {"seed": trainer.seed, "lora_rank": trainer.lora_rank, "lora_alpha": trainer.lora_alpha,
            "lora_targets": list(trainer.lora_targets), "precision": hybrid.precision,
            "learning_rate": hybrid.learning_rate, "ppo_epochs": hybrid.ppo_epochs,
            "kl_coef": hybrid.kl_coef, "kl_target": hybrid.kl_target,
            "critic_learning_rate": hybrid.critic_learning_rate, "aligned": hybrid.aligned,
            "reward_learning_rate": hybrid.reward_learning_rate, "reward_window": hybrid.reward_window,
            "reward_batch": hybrid.reward_batch, "adapter_prefix": settings.mlflow.registered_model}


class ColocatedPPO:
    """The hybrid actor group, its critic and the reward model, driven as one loop."""

    def __init__(self, settings: Settings) -> None:
        import ray

        from online_rl.hybrid.reward import RewardWorker
        from online_rl.ray_runtime import init_ray, resolve_precision_on
        from online_rl.trainer.critic import CriticWorker

        init_ray(settings)
        self.settings, self.config = settings, settings.hybrid
        self.worker_config = worker_config(settings)
        model = str(settings.model_dir)
        cpus = self.config.cpus_per_worker or max(1.0, float(settings.ray.num_cpus // self.config.world))
        self.group = HybridGroup(model, self.worker_config, self.config.dp, self.config.fsdp, self.config.tp,
                                 cpus, self.config.gpus_per_worker, cache_dir=settings.cache_dir)
        # the critic and the reward model time-share device 0's bundle, as verl colocates them
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        share = PlacementGroupSchedulingStrategy(self.group.placement, 0)
        device = "cpu"  # they share device 0's bundle, whose GPU (if any) the hybrid worker holds
        threads = max(1, int(cpus))
        self.precision = self.group.precision
        if self.config.gpus_per_worker:  # the policy's choice was the GPU's: theirs is the CPU's
            self.precision = resolve_precision_on(
                share, {"num_cpus": 0}, self.config.precision, device, model, threads, settings.cache_dir,
                "hybrid.precision (CPU)")
        self.worker_config = {**self.worker_config, "precision": self.precision.precision}
        self.critic: Any = ray.remote(CriticWorker).options(num_cpus=0, scheduling_strategy=share).remote(
            model, self.worker_config, threads, device)
        self.reward: Any = ray.remote(RewardWorker).options(num_cpus=0, scheduling_strategy=share).remote(
            model, self.worker_config, threads, device)
        base = ppo_config(self.worker_config)
        self.ppo = replace(base, kl=replace(base.kl, horizon=self.config.kl_horizon))
        self.kl = AdaptiveKLController(self.ppo.kl)
        self.kl_coef = self.config.kl_coef
        self.prompts: deque[tuple[int, ...]] = deque(maxlen=self.config.prompt_window)
        self.pending: list[Pair] = []
        self.pairs_seen = 0
        self.steps = 0
        self.random = random.Random(settings.trainer.seed)

    # -- what the stream brings ------------------------------------------------------------------
    def observe(self, prompts: Sequence[Sequence[int]] = (), pairs: Sequence[Pair] = ()) -> None:
        """Recent prompts (the newest `prompt_window` kept, repeats moved to the front) and new
        preference pairs for the reward model."""
        for prompt in prompts:
            key = tuple(prompt)
            if key in self.prompts:
                self.prompts.remove(key)
            self.prompts.append(key)
        self.pending.extend((list(p), list(c), list(r)) for p, c, r in pairs)
        self.pairs_seen += len(pairs)

    @property
    def ready(self) -> bool:
        return len(self.prompts) > 0 and self.pairs_seen >= self.config.min_pairs

    # -- one iteration ---------------------------------------------------------------------------
    def learn_rewards(self) -> dict[str, float]:
        import ray

        pairs, self.pending = self.pending, []
        return dict(ray.get(self.reward.learn.remote(pairs, self.config.reward_steps)))

    def rollouts(self, prompts: Sequence[Sequence[int]], temperature: float | None = None,
                 seed: int | None = None) -> tuple[list[tuple[list[int], list[int]]], list[list[float]],
                                                   dict[str, float]]:
        """Switch to generation, sample a completion per prompt with the current policy, switch back."""
        start = time.perf_counter()
        moved = self.group.to_generation(keep_base=self.config.keep_base)
        switched = time.perf_counter()
        try:
            out = self.group.generate(prompts, self.config.max_new_tokens,
                                      self.config.temperature if temperature is None else temperature,
                                      seed=self.steps * 7919 if seed is None else seed)
            generated = time.perf_counter()
        finally:
            self.group.to_training()  # the training shards come back even when generation fails
        rollouts = [(list(p), o["token_ids"]) for p, o in zip(prompts, out, strict=True)]
        tokens = sum(len(c) for _, c in rollouts)
        adapter_bytes = max(m["adapter"]["received_bytes"] for m in moved)
        return rollouts, [o["logprobs"] for o in out], {
            "to_generation_s": switched - start, "generate_s": generated - switched,
            "to_training_s": time.perf_counter() - generated, "generated_tokens": float(tokens),
            "generate_tokens_per_s": tokens / max(generated - switched, 1e-9),
            "adapter_sync_bytes": float(adapter_bytes)}

    def step(self) -> dict[str, float]:
        """One PPO iteration on fresh rollouts (call when `ready`)."""
        import ray

        start = time.perf_counter()
        metrics = self.learn_rewards()
        prompts = [list(p) for p in self.random.choices(list(self.prompts), k=self.config.rollout_batch)]
        rollouts, behaviour, timing = self.rollouts(prompts)
        scores = ray.get(self.reward.score.remote(rollouts))
        scored = self.group.score(rollouts)
        old, ref = [s[0] for s in scored], [s[1] for s in scored]
        # the critic's rollouts carry the score in the trainer's Rollout shape
        full = [(p, c, b, r) for (p, c), b, r in zip(rollouts, behaviour, scores, strict=True)]
        values = ray.get(self.critic.values.remote(full))
        out = advantages_for(full, old, ref, values, self.ppo, self.kl_coef)
        critic = self.critic.train_step.remote(full, out.returns, values)
        metrics |= self.group.ppo_train(rollouts, old, out.advantages, behaviour)
        metrics |= dict(ray.get(critic))
        if self.ppo.kl.target is not None:
            self.kl_coef = self.kl.update(out.sequence_kl, len(rollouts))
        gap = [abs(o - b) for row, served in zip(old, behaviour, strict=True)
               for o, b in zip(row, served, strict=True)]
        self.steps += 1
        metrics |= timing | {"step": float(self.steps), "reward": out.mean_reward, "kl": out.sequence_kl,
                             "kl_coef": self.kl_coef, "rollouts": float(len(rollouts)),
                             "behaviour_gap": sum(gap) / max(1, len(gap)),
                             "iteration_s": time.perf_counter() - start}
        logger.info("hybrid ppo step %d: reward %.3f kl %.3f (coef %.3f) in %.1fs", self.steps,
                    out.mean_reward, out.sequence_kl, self.kl_coef, metrics["iteration_s"],
                    extra={"event": "hybrid_step", **{k: round(v, 6) for k, v in metrics.items()}})
        return metrics

    def evaluate(self, prompts: Sequence[Sequence[int]], samples: int = 1,
                 seed: int = 1234) -> dict[str, float]:
        """On held-out prompts, with the reward model as it is now: its mean score of the policy's
        sampled completions and of the base model's (same seeds), and the policy completions' mean KL
        to the reference (the summed log-ratio per completion)."""
        import ray

        batch = [list(p) for p in prompts for _ in range(samples)]
        self.group.to_generation(keep_base=self.config.keep_base)
        try:
            length, temperature = self.config.max_new_tokens, self.config.temperature
            policy = self.group.generate(batch, length, temperature, seed=seed)
            base = self.group.generate(batch, length, temperature, seed=seed, adapter=None)
        finally:
            self.group.to_training()
        ours = [(p, o["token_ids"]) for p, o in zip(batch, policy, strict=True)]
        theirs = [(p, o["token_ids"]) for p, o in zip(batch, base, strict=True)]
        scores = ray.get(self.reward.score.remote(ours + theirs))
        kl = [sum(o) - sum(r) for o, r in self.group.score(ours)]
        n = len(batch)
        return {"reward": sum(scores[:n]) / n, "base_reward": sum(scores[n:]) / n, "kl": sum(kl) / n,
                "completion_tokens": sum(len(c) for _, c in ours) / n,
                "base_completion_tokens": sum(len(c) for _, c in theirs) / n}

    def save_adapter(self, folder: str) -> None:
        self.group.save_adapter(folder)

    def close(self) -> None:
        import ray

        for actor in (self.critic, self.reward):
            ray.kill(actor)
        self.group.close()
