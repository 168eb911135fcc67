"""The hybrid actors on Ray: one `HybridWorker` per device, driven as one by a single controller.

Rollouts are split across the generation engine replicas (every rank of a replica gets the same
prompts and decodes them together); training batches are split across every device (FSDP). The
group knows nothing about the bus, the reward model or MLflow.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from online_rl.errors import ConfigError
from online_rl.ray_runtime import resolve_precision_on
from online_rl.trainer.spec import HybridSpec

__all__ = ["HybridGroup", "split"]

logger = logging.getLogger(__name__)


def split(items: Sequence[Any], parts: int) -> list[list[int]]:
    """Indices of `items` dealt round-robin into `parts` lists."""
    return [list(range(k, len(items), parts)) for k in range(parts)]


class HybridGroup:
    """`dp × fsdp` hybrid workers in one Ray placement group, joined in one process group."""

    def __init__(self, spec: HybridSpec, dp: int = 1, fsdp: int = 1, tp: int = 1,
                 cpus_per_worker: float = 1.0, gpus_per_worker: float = 0.0, placement: str = "PACK",
                 cache_dir: Path | None = None) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from online_rl.hybrid.worker import HybridWorker

        self.world = dp * fsdp
        if self.world % tp:
            raise ConfigError(f"hybrid.tp={tp} must divide the {self.world} devices (dp {dp} × fsdp {fsdp})")
        bundle = {"CPU": cpus_per_worker} | ({"GPU": gpus_per_worker} if gpus_per_worker else {})
        self.placement = placement_group([dict(bundle) for _ in range(self.world)], strategy=placement)
        try:
            ray.get(self.placement.ready(), timeout=120)
        except ray.exceptions.GetTimeoutError as error:
            ray.util.remove_placement_group(self.placement)
            raise RuntimeError(f"Ray cannot place {self.world} hybrid workers of {bundle} (cluster: "
                               f"{ray.cluster_resources()}); lower hybrid.dp/fsdp or cpus_per_worker"
                               ) from error
        device = "cuda" if gpus_per_worker else "cpu"
        try:  # `precision: auto` is decided on device 0, with its threads
            self.precision = resolve_precision_on(
                PlacementGroupSchedulingStrategy(self.placement, 0),
                {"num_cpus": cpus_per_worker, "num_gpus": gpus_per_worker},
                spec.model.precision, device, spec.model.model_dir, max(1, int(cpus_per_worker)),
                cache_dir, "hybrid.precision")
        except Exception:
            ray.util.remove_placement_group(self.placement)
            raise
        self.spec = spec = spec.resolved(self.precision.precision)
        remote: Any = ray.remote(HybridWorker)
        self.workers = [
            remote.options(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker,
                           scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement, r))
            .remote(spec, max(1, int(cpus_per_worker)), device)
            for r in range(self.world)]
        try:
            address, port = ray.get(self.workers[0].rendezvous.remote())
            roles = ray.get([w.join.remote(address, port, r, {"dp": dp, "fsdp": fsdp}, tp)
                             for r, w in enumerate(self.workers)])
        except Exception:
            self.close()
            raise
        self.roles = roles
        self.replicas: list[list[int]] = []
        for role in roles:
            if role["tp_rank"] == 0:
                self.replicas.append(list(role["ranks"]))
        self.replicas.sort()
        logger.info("hybrid group: %d device(s), training dp=%d fsdp=%d, generation %d replica(s) of tp=%d",
                    self.world, dp, fsdp, len(self.replicas), tp)

    def _all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        import ray

        return list(ray.get([getattr(w, method).remote(*args, **kwargs) for w in self.workers]))

    def to_generation(self, method: str = "hybrid", keep_base: bool = True) -> list[dict[str, Any]]:
        return self._all("to_generation", method, keep_base)

    def to_training(self) -> list[dict[str, Any]]:
        return self._all("to_training")

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 1.0,
                 seed: int = 0, adapter: str | None = "current") -> list[dict[str, Any]]:
        """Completions for `prompts` (in order), the prompts dealt across the engine replicas."""
        import ray

        shares = split(prompts, len(self.replicas))
        calls = []
        for replica, (ranks, share) in enumerate(zip(self.replicas, shares, strict=True)):
            batch = [list(prompts[i]) for i in share]
            calls.append([self.workers[r].generate.remote(batch, max_new_tokens, temperature, seed + replica,
                                                          adapter) for r in ranks])
        out: list[Any] = [None] * len(prompts)
        for share, refs in zip(shares, calls, strict=True):
            results = ray.get(refs)[0]  # every rank of the replica returns the same completions
            for index, result in zip(share, results, strict=True):
                out[index] = result
        return out

    def score(self, rollouts: Sequence[tuple[list[int], list[int]]]) -> list[tuple[list[float], list[float]]]:
        """(pi_old, reference) token log-probs per rollout, the rollouts dealt across every device."""
        import ray

        shares = split(rollouts, self.world)
        if any(not s for s in shares):
            raise ConfigError(f"{len(rollouts)} rollouts cannot keep {self.world} FSDP devices busy: "
                              "raise hybrid.rollout_batch to at least dp × fsdp")
        parts = ray.get([w.score.remote([rollouts[i] for i in s]) for w, s in zip(self.workers, shares,
                                                                                   strict=True)])
        out: list[Any] = [None] * len(rollouts)
        for share, part in zip(shares, parts, strict=True):
            for index, result in zip(share, part, strict=True):
                out[index] = result
        return out

    def ppo_train(self, rollouts: Sequence[tuple[list[int], list[int]]], old: Sequence[list[float]],
                  advantages: Sequence[list[float]], behaviour: Sequence[list[float]],
                  ref: Sequence[list[float]] | None = None) -> dict[str, float]:
        """The PPO step on every device's share; `ref` (the reference's log-probs) for an in-loss KL."""
        import ray

        shares = split(rollouts, self.world)
        parts = ray.get([w.ppo_train.remote([rollouts[i] for i in s], [old[i] for i in s],
                                            [advantages[i] for i in s], [behaviour[i] for i in s],
                                            [ref[i] for i in s] if ref is not None else None)
                         for w, s in zip(self.workers, shares, strict=True)])
        merged = {k: sum(p[k] for p in parts) / len(parts) for k in parts[0]
                  if k not in ("step_s", "grad_norm")}
        return merged | {"step_s": max(p["step_s"] for p in parts), "grad_norm": parts[0]["grad_norm"]}

    def full_weights(self) -> dict[str, Any]:
        return self._all("full_weights")[0]

    def generation_shards(self) -> list[dict[str, Any]]:
        return self._all("generation_shards")

    def plan_summary(self) -> dict[str, Any]:
        import ray

        return dict(ray.get(self.workers[0].plan_summary.remote()))

    def avoid_cores(self, cores: set[int]) -> list[list[int]]:
        """Bind every device's threads to the cores outside `cores` (the vLLM engine's); the cores each
        device kept."""
        return self._all("avoid_cores", cores)

    def adapter_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The adapter's full tensors (PEFT's names) and its LoRA config, gathered from the FSDP shards."""
        state = self._all("adapter_state")[0]
        assert state is not None
        return state

    def save_adapter(self, folder: str) -> None:
        """The adapter written as a PEFT folder here, on the driver's node."""
        from online_rl.registry.lineage import write_folder

        write_folder(folder, self._all("adapter_files")[0])

    def close(self) -> None:
        import ray

        for worker in self.workers:
            ray.kill(worker)
        ray.util.remove_placement_group(self.placement)
        self.workers = []
