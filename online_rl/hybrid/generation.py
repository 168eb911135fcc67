"""The rollout flow's generation engines behind one interface (`hybrid.engine`).

- `TpGeneration` (`tp`): the hybrid devices themselves, switched to generation by the HybridEngine
  (`to_generation` reshards the base once and the adapter every time into `TensorParallelLlama`
  shards) and back to training after sampling (`release`).
- `VllmGeneration` (`vllm`): a vLLM engine in its own Ray actor on its own CPUs (or GPU) with the base
  loaded once by vLLM; a sync gathers the adapter's tensors from the FSDP shards and installs them in
  the engine's memory under a new immutable name (`online_rl.hybrid.vllm_rollout`); the previous
  version is unloaded once no rollout in flight uses it. The devices never leave training.

Both name the synced adapter `<registered-model>-sync<N>` and report the bytes a sync moved.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from online_rl.errors import ConfigError

if TYPE_CHECKING:
    from online_rl.config import Settings
    from online_rl.hybrid.group import HybridGroup

__all__ = ["TpGeneration", "VllmGeneration", "generation_for"]


class TpGeneration:
    """Generation on the hybrid devices' own tensor-parallel engine."""

    name = "tp"

    def __init__(self, group: HybridGroup, keep_base: bool) -> None:
        self.group, self.keep_base = group, keep_base
        self.current: str | None = None

    def sync(self) -> dict[str, Any]:
        """Switch the devices to generation with the policy's adapter; the bytes moved."""
        moved = self.group.to_generation(keep_base=self.keep_base)
        self.current = moved[0]["adapter_name"]
        return {"adapter_name": self.current,
                "adapter_sync_bytes": max(m["adapter"]["received_bytes"] for m in moved),
                "base_bytes": max((m["base"] or {}).get("received_bytes", 0) for m in moved),
                "files_written": []}

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float,
                 seed: int, adapter: str | None = "current") -> list[dict[str, Any]]:
        return self.group.generate(prompts, max_new_tokens, temperature, seed=seed,
                                   adapter=self.current if adapter == "current" else adapter)

    def release(self) -> None:
        """Back to training (the devices were lent to generation)."""
        self.group.to_training()

    def close(self) -> None:
        pass


class VllmGeneration:
    """Generation on a vLLM engine beside the training devices, adapters synced from memory."""

    name = "vllm"

    def __init__(self, group: HybridGroup, settings: Settings) -> None:
        import ray

        from online_rl.hybrid.vllm_rollout import VllmRollouts

        config = settings.hybrid
        if config.tp > 1:
            raise ConfigError(f"hybrid.tp={config.tp} with hybrid.engine=vllm: the vLLM rollout engine runs "
                              "one process here; set hybrid.tp=1 (or hybrid.engine=tp)")
        self.group = group
        self.prefix = group.spec.adapter_prefix
        self.syncs = 0
        self.current: str | None = None
        self.in_use: dict[str, int] = {}  # adapter name -> rollouts in flight that sample with it
        lora = settings.trainer
        options: dict[str, Any] = {"num_cpus": config.engine_cpus}
        if config.engine_gpus:
            options["num_gpus"] = config.engine_gpus
        remote: Any = ray.remote(VllmRollouts)
        ahead = max(config.max_staleness, config.rollout_ahead or 0)
        # versions in flight (ahead + 1), the current one, and one an evaluation may install meanwhile
        self.actor: Any = remote.options(**options).remote(
            str(settings.model_dir), max_lora_rank=lora.lora_rank,
            max_adapters=ahead + 3, max_model_len=config.engine_max_model_len,
            max_batch=max(8, config.rollout_batch * (config.critic_free.group_size
                                                      if config.critic_free is not None else 1)),
            threads=max(1, int(config.engine_cpus)), seed=lora.seed, extra_args=config.engine_args)
        try:
            ready = ray.get(self.actor.ready.remote())
        except Exception:
            ray.kill(self.actor)
            raise
        self.start_s = float(ready["start_s"])
        self.engine_cores: list[int] = list(ready["cores"])
        if self.engine_cores:  # generation and training on separate cores
            group.avoid_cores(set(self.engine_cores))

    def sync(self, wait: bool = True) -> dict[str, Any]:
        """Gather the adapter from the FSDP shards and install it under a new name; unload the versions
        no rollout in flight uses. With `wait=False` the install is queued behind the engine's running
        batches and `finish` collects its figures later: the trainer does not wait for generation."""
        start = time.perf_counter()
        tensors, config = self.group.adapter_state()
        gathered = time.perf_counter()
        self.syncs += 1
        name = f"{self.prefix}-sync{self.syncs}"
        pending = self.actor.install.remote(name, tensors, config)
        previous, self.current = self.current, name
        if previous is not None:
            self.retire(previous)
        out = {"adapter_name": name, "base_bytes": 0, "gather_s": gathered - start,
               "adapter_sync_bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
               "install": pending}
        return self.finish(out) if wait else out

    def finish(self, sync: dict[str, Any]) -> dict[str, Any]:
        """A sync's figures once its install has run: `install_s`, `sync_s` (gather + install),
        `files_written` (files opened for writing during the install: none expected)."""
        import ray

        pending = sync.pop("install", None)
        if pending is not None:
            out = ray.get(pending)
            sync |= {"install_s": out["install_s"], "sync_s": sync["gather_s"] + out["install_s"],
                     "files_written": out["files_written"], "adapter_sync_bytes": out["bytes"]}
        return sync

    def retire(self, name: str) -> None:
        """Unload `name` unless it is current or rollouts in flight still sample with it (queued behind
        the engine's running batches; the trainer does not wait for it)."""
        if name != self.current and not self.in_use.get(name):
            self.in_use.pop(name, None)
            self.actor.unload.remote(name)

    def submit(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float, seed: int,
               adapter: str | None = "current") -> tuple[Any, str | None]:
        """Start sampling (a Ray reference to the completions) and the adapter it samples with."""
        name = self.current if adapter == "current" else adapter
        if name is not None:
            self.in_use[name] = self.in_use.get(name, 0) + 1
        ref = self.actor.generate_timed.remote([list(p) for p in prompts], max_new_tokens, temperature, seed,
                                               name)
        return ref, name

    def done(self, name: str | None) -> None:
        """A submitted batch that sampled with `name` has been collected."""
        if name is not None:
            self.in_use[name] -= 1
            self.retire(name)

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float,
                 seed: int, adapter: str | None = "current") -> list[dict[str, Any]]:
        import ray

        ref, name = self.submit(prompts, max_new_tokens, temperature, seed, adapter)
        try:
            return list(ray.get(ref)["completions"])
        finally:
            self.done(name)

    def adapters(self) -> dict[str, Any]:
        import ray

        return dict(ray.get(self.actor.adapters.remote()))

    def release(self) -> None:
        pass  # the devices never left training

    def close(self) -> None:
        import ray

        ray.kill(self.actor)


def generation_for(settings: Settings, group: HybridGroup) -> TpGeneration | VllmGeneration:
    if settings.hybrid.engine == "vllm":
        return VllmGeneration(group, settings)
    return TpGeneration(group, settings.hybrid.keep_base)
