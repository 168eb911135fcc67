"""A group of data-parallel policy workers on Ray, driven as one by the trainer's controller.

The verl/HybridFlow programming model: the single controller calls `train_step` on the group; the
group splits the batch into one `Shard` per rank, the ranks train their shards and sum their
gradients among themselves (torch.distributed), and the group adds up their metrics. The workers are
placed by a Ray placement group (one bundle of CPUs, and GPUs if asked, per rank; PACK shares nodes,
SPREAD separates them). It knows nothing about the bus, checkpoints on disk or MLflow.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from online_rl.ray_runtime import resolve_precision_on
from online_rl.registry.lineage import write_folder
from online_rl.trainer.checkpoint import Checkpoint
from online_rl.trainer.samples import Routed, shard

if TYPE_CHECKING:
    from online_rl.config import Settings
    from online_rl.trainer.spec import CriticSpec, PolicySpec

__all__ = ["WorkerGroup", "merge_metrics"]

logger = logging.getLogger(__name__)


class WorkerGroup:
    """`settings.trainer.workers` policy workers in one placement group, joined in a process group."""

    def __init__(self, settings: Settings, policy: PolicySpec, critic: CriticSpec) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from online_rl.trainer.worker import PolicyWorker

        trainer = settings.trainer
        self.size = trainer.workers
        cpus = trainer.cpus_per_worker or max(1.0, float(settings.ray.num_cpus // self.size))
        bundle = {"CPU": cpus} | ({"GPU": trainer.gpus_per_worker} if trainer.gpus_per_worker else {})
        self.placement = placement_group([dict(bundle) for _ in range(self.size)], strategy=trainer.placement)
        try:
            ray.get(self.placement.ready(), timeout=120)
        except ray.exceptions.GetTimeoutError as error:
            ray.util.remove_placement_group(self.placement)
            raise RuntimeError(
                f"Ray cannot place {self.size} trainer workers of {bundle} with strategy {trainer.placement}"
                f" (cluster: {ray.cluster_resources()}); lower trainer.workers or trainer.cpus_per_worker"
            ) from error
        device = "cuda" if trainer.gpus_per_worker else "cpu"
        # `precision: auto` is decided where the ranks compute: rank 0's bundle, its device, its threads
        try:
            self.precision = resolve_precision_on(
                PlacementGroupSchedulingStrategy(self.placement, 0),
                {"num_cpus": cpus, "num_gpus": trainer.gpus_per_worker}, policy.model.precision, device,
                str(settings.model_dir), max(1, int(cpus)), settings.cache_dir, "trainer.precision")
        except Exception:
            ray.util.remove_placement_group(self.placement)
            raise
        self.spec = policy = policy.resolved(self.precision.precision)
        critic = critic.resolved(self.precision.precision)
        self._critic_args = (settings, critic, cpus, bundle, device)
        self.critic: Any = None
        self.critic_placement: Any = None
        remote: Any = ray.remote(PolicyWorker)
        self.workers: list[Any] = [
            remote.options(num_cpus=cpus, num_gpus=trainer.gpus_per_worker,
                           scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement, rank))
            .remote(policy, max(1, int(cpus)), device)
            for rank in range(self.size)
        ]
        try:
            if self.size > 1:
                address, port = ray.get(self.workers[0].rendezvous.remote())
                ray.get([w.join.remote(address, port, rank, self.size)
                         for rank, w in enumerate(self.workers)])
            else:
                ray.get(self.workers[0].context_length.remote())  # surfaces a failed start here
        except Exception:
            self.close()  # a worker that could not start: give its CPUs back before raising
            raise
        logger.info("trainer worker group: %d worker(s) of %s each (%s)", self.size, bundle,
                    trainer.placement)

    def train_step(self, routed: Routed, anchor_kl_coef: float | None = None,
                   kto_weights: tuple[float, float] | None = None) -> dict[str, float]:
        """One optimizer step on every rank over `routed`'s samples (the cold-start KL term weighted by
        `anchor_kl_coef`, KTO's labels by `kto_weights`; the spec's where None); the merged metrics."""
        import ray

        shards = shard(routed, self.size, anchor_kl_coef, kto_weights)
        parts = ray.get([w.train_step.remote(s) for w, s in zip(self.workers, shards, strict=True)])
        return merge_metrics(parts)

    # -- PPO: the policy ranks and the critic ------------------------------------------------------
    def ensure_critic(self) -> None:
        """Start PPO's critic (once): in policy rank 0's bundle ('shared') or its own ('separate')."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from online_rl.trainer.critic import CriticWorker

        if self.critic is not None:
            return
        settings, spec, cpus, bundle, device = self._critic_args
        resources: dict[str, float]
        placement = settings.trainer.critic_placement
        if placement == "shared" or (placement == "auto" and not settings.trainer.gpus_per_worker):
            strategy, resources = PlacementGroupSchedulingStrategy(self.placement, 0), {"num_cpus": 0}
        else:
            self.critic_placement = placement_group([dict(bundle)])
            try:
                ray.get(self.critic_placement.ready(), timeout=120)
            except ray.exceptions.GetTimeoutError as error:
                ray.util.remove_placement_group(self.critic_placement)
                self.critic_placement = None
                raise RuntimeError(
                    f"Ray cannot place PPO's critic ({bundle}) beside the policy workers (cluster: "
                    f"{ray.cluster_resources()}); set trainer.critic_placement=shared or free resources"
                ) from error
            strategy = PlacementGroupSchedulingStrategy(self.critic_placement, 0)
            resources = {"num_cpus": cpus, "num_gpus": settings.trainer.gpus_per_worker}
        remote: Any = ray.remote(CriticWorker)
        self.critic = remote.options(scheduling_strategy=strategy, **resources).remote(
            spec, max(1, int(cpus)), device)
        logger.info("PPO critic started (%s)", settings.trainer.critic_placement)

    def ppo_score(self, routed: Routed) -> tuple[list[Any], list[list[float]]]:
        """Per rollout (in `routed` order): (pi_old, reference) token log-probs, and the critic's values."""
        import ray

        self.ensure_critic()
        shards = shard(routed, self.size)
        values = self.critic.values.remote(routed.rollouts)
        parts = ray.get([w.ppo_score.remote(s.rollouts) for w, s in zip(self.workers, shards, strict=True)])
        scored: list[Any] = [None] * len(routed.rollouts)
        for part, piece in zip(shards, parts, strict=True):
            for index, result in zip(part.rollout_index, piece, strict=True):
                scored[index] = result
        return scored, list(ray.get(values))

    def ppo_train(self, routed: Routed, old: list[list[float]], advantages: list[list[float]],
                  returns: list[list[float]], values: list[list[float]]) -> dict[str, float]:
        """The policy's PPO epochs on every rank and the critic's, at the same time."""
        import ray

        shards = shard(routed, self.size)
        critic = self.critic.train_step.remote(routed.rollouts, returns, values)
        parts = ray.get([w.ppo_train.remote(s, [old[i] for i in s.rollout_index],
                                            [advantages[i] for i in s.rollout_index])
                         for w, s in zip(self.workers, shards, strict=True)])
        tokens = sum(p["tokens"] for p in parts) or 1
        merged = {"ppo_loss": sum(p.get("ppo_loss", 0.0) for p in parts), "grad_norm": parts[0]["grad_norm"],
                  "step_s": max(p["step_s"] for p in parts)}
        if any(p.get("nonfinite") for p in parts):
            merged["nonfinite"] = 1.0
        for name in ("ppo_clip_fraction", "ppo_approx_kl", "ppo_truncated_fraction"):
            merged[name] = sum(p.get(name, 0.0) for p in parts) / tokens
        return merged | dict(ray.get(critic))

    # -- references ---------------------------------------------------------------------------------
    def set_anchor(self, files: dict[str, bytes] | None) -> None:
        """The frozen adapter every rank's KL term holds to (None: the base)."""
        import ray

        ray.get([w.set_anchor.remote(files) for w in self.workers])

    def set_baseline(self, files: dict[str, bytes] | None) -> None:
        """The last published adapter, for evaluation (rank 0 evaluates)."""
        import ray

        ray.get(self.workers[0].set_baseline.remote(files))

    def evaluate(self, pairs: list[Any], thumbs: list[Any]) -> dict[str, float]:
        import ray

        return dict(ray.get(self.workers[0].evaluate.remote(pairs, thumbs)))

    def answer_greedy(self, prompts: list[list[int]], max_new_tokens: int, pad_id: int, eos_id: int,
                      base: bool = False) -> list[list[int]]:
        """Rank 0's greedy answers (every rank holds the same adapter)."""
        import ray

        return list(ray.get(self.workers[0].answer_greedy.remote(prompts, max_new_tokens, pad_id, eos_id,
                                                                 base)))

    def answer_sampled(self, prompts: list[list[int]], samples: int, max_new_tokens: int, pad_id: int,
                       eos_id: int, temperature: float, seed: int) -> list[list[list[int]]]:
        """Rank 0's sampled answers, `samples` per prompt (fact rehearsal)."""
        import ray

        return list(ray.get(self.workers[0].answer_sampled.remote(prompts, samples, max_new_tokens, pad_id,
                                                                  eos_id, temperature, seed)))

    def reset_adapter(self, files: dict[str, bytes] | None, learning_rate: float) -> None:
        """Every rank's adapter back to `files` (None: as the base), with a fresh optimizer."""
        import ray

        ray.get([w.reset_adapter.remote(files, learning_rate) for w in self.workers])

    def shrink_adapter(self, files: dict[str, bytes] | None, keep: float) -> None:
        """Every rank's adapter moved back towards `files` (None: the base), keeping `keep` of its change."""
        import ray

        ray.get([w.shrink_adapter.remote(files, keep) for w in self.workers])

    def set_learning_rate(self, learning_rate: float) -> None:
        import ray

        ray.get([w.set_learning_rate.remote(learning_rate) for w in self.workers])

    def snapshot(self) -> dict[str, Any]:
        """Rank 0's adapter, optimizer and random state (every rank holds the same), and the critic's."""
        import ray

        snapshot = dict(ray.get(self.workers[0].snapshot.remote()))
        snapshot["critic"] = ray.get(self.critic.snapshot.remote()) if self.critic is not None else None
        return snapshot

    def restore(self, checkpoint: Checkpoint) -> None:
        import ray

        ray.get([w.restore.remote(checkpoint) for w in self.workers])
        if checkpoint.critic is not None:
            self.ensure_critic()
            ray.get(self.critic.restore.remote(checkpoint.critic))

    def save_adapter(self, folder: str) -> None:
        """Rank 0's adapter written as a PEFT folder here, on the driver's node."""
        import ray

        write_folder(folder, ray.get(self.workers[0].adapter_files.remote()))

    def context_length(self) -> int:
        import ray

        return int(ray.get(self.workers[0].context_length.remote()))

    def vocab_size(self) -> int:
        import ray

        return int(ray.get(self.workers[0].vocab_size.remote()))

    def adapters(self) -> list[dict[str, Any]]:
        """Each rank's adapter weights."""
        import ray

        return list(ray.get([w.adapter.remote() for w in self.workers]))

    def close(self) -> None:
        """Stop the workers and free their placement (their CPUs go back to Ray)."""
        import ray

        for worker in [*self.workers, *([self.critic] if self.critic is not None else [])]:
            ray.kill(worker)
        ray.util.remove_placement_group(self.placement)
        if self.critic_placement is not None:
            ray.util.remove_placement_group(self.critic_placement)
        self.workers, self.critic, self.critic_placement = [], None, None


def merge_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """The step's metrics from each rank's sums: means per sample kind, the summed loss, the slowest
    rank's time."""
    pairs = sum(p["pairs"] for p in parts)
    thumbs = sum(p["thumbs"] for p in parts)
    step_s = max(p["step_s"] for p in parts)
    tokens = sum(p["tokens"] for p in parts)
    merged = {"loss": sum(p["loss"] for p in parts), "grad_norm": parts[0]["grad_norm"], "step_s": step_s,
              "tokens_per_s": tokens / step_s, "samples_per_s": (pairs + thumbs) / step_s}
    for name, count in (("dpo_loss", pairs), ("dpo_accuracy", pairs), ("dpo_margin", pairs),
                        ("kto_loss", thumbs), ("kto_reward", thumbs), ("kto_kl", thumbs)):
        if count:
            merged[name] = sum(p.get(name, 0.0) for p in parts) / count
    if any(p.get("nonfinite") for p in parts):
        merged["nonfinite"] = 1.0  # the update was skipped on every rank
    anchor_tokens = sum(p.get("anchor_tokens", 0) for p in parts)
    if anchor_tokens:  # the cold-start KL term: mean KL(reference || policy) per anchor token
        merged["anchor_kl"] = sum(p.get("anchor_kl", 0.0) for p in parts) / anchor_tokens
    return merged
