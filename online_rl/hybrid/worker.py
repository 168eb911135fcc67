"""The hybrid actor: one device that trains the policy under FSDP and generates with it, in turns.

`HybridWorker` runs inside a Ray actor (one per device; `HybridGroup` drives them). In training mode
its LoRA policy is sharded by torch FSDP2 (`fully_shard`; HSDP over a (dp, fsdp) mesh when dp > 1),
each parameter along the dimension its layout names. `to_generation` reshards the base weights into
tensor-parallel shards (`Resharder`, the plan of `online_rl.hybrid.plan`) and builds this device's
share of a `TensorParallelLlama` engine; the base is frozen, so its generation copy is made once and
kept (`keep_base`), and every later transition moves only the adapter's tensors, installed in memory
under a new immutable name. With `keep_base=False` every transition reshards everything, the
training shards whose data now lives inside the generation copy give their memory back while it
exists (zero redundancy), and `to_training` frees the copy and restores them.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from online_rl.algos import Sample, aggregate, kl_penalty, pack, policy_loss
from online_rl.algos.batch import autocast
from online_rl.hybrid.engine import Resharder, TransitionStats, cut
from online_rl.hybrid.layout import GenerationLayout, TrainingLayout, contains, llama_specs
from online_rl.hybrid.plan import ReshardPlan, plan_reshard
from online_rl.hybrid.tp import TensorParallelLlama
from online_rl.trainer.spec import HybridSpec, adamw, build_lora, clipped_step
from online_rl.trainer.worker import PolicyWorker

__all__ = ["HybridWorker"]


def _local(parameter: Any) -> torch.Tensor:
    return parameter.to_local() if hasattr(parameter, "to_local") else parameter.data


def _full(parameter: Any) -> torch.Tensor:
    return parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter.data


class HybridWorker:
    """One device's policy: FSDP training shards, and (in generation mode) its tensor-parallel shards."""

    def __init__(self, spec: HybridSpec, threads: int = 1, device: str = "cpu") -> None:
        torch.set_num_threads(max(1, threads))
        self.spec, self.threads, self.device = spec, threads, device
        self.engine: TensorParallelLlama | None = None
        self.adapter_name: str | None = None
        self.syncs = 0
        self.released: list[tuple[int, int]] = []  # (param index, storage bytes) given back during generation
        self.keep_base = True

    # -- the process group and the model -------------------------------------------------------
    rendezvous = PolicyWorker.rendezvous  # rank 0's address and a free port for the process group

    def join(self, address: str, port: int, rank: int, training: dict[str, int], tp: int) -> dict[str, Any]:
        """Form the process group, build and shard the policy, plan both transitions. Every device calls
        this at once. Returns this device's generation role."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import Shard

        self.layout = TrainingLayout(**training)
        world = self.layout.world
        backend = "nccl" if self.device.startswith("cuda") else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=world,
                                timeout=timedelta(minutes=10))
        self.rank = rank
        spec = self.spec
        # the base stays float32 here: FSDP shards it, autocast does the casting
        self.policy, self.model_config = build_lora(spec.model, "policy", self.threads, cast=False)
        self.lora_scale = spec.model.lora.alpha / spec.model.lora.rank
        self.policy.to(self.device)
        named = list(self.policy.named_parameters())
        base_named = [(n, p) for n, p in named if not p.requires_grad]
        lora_named = [(n, p) for n, p in named if p.requires_grad]
        self.base_specs = llama_specs([(n, p.shape) for n, p in base_named], self.model_config,
                                      aligned=spec.aligned)
        self.lora_specs = llama_specs([(n, p.shape) for n, p in lora_named], self.model_config,
                                      aligned=spec.aligned)
        everything = zip(base_named + lora_named, self.base_specs + self.lora_specs, strict=True)
        placement = {id(p): Shard(s.train_dim) for (_, p), s in everything}
        if self.layout.dp > 1:
            mesh = init_device_mesh(self.device.split(":")[0], (self.layout.dp, self.layout.fsdp),
                                    mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh(self.device.split(":")[0], (self.layout.fsdp,))
        for layer in self.policy.base_model.model.model.layers:
            fully_shard(layer, mesh=mesh, shard_placement_fn=lambda p: placement.get(id(p)))
        fully_shard(self.policy, mesh=mesh, shard_placement_fn=lambda p: placement.get(id(p)))
        # FSDP swaps in DTensor parameters: look them up again, in the same order
        params = dict(self.policy.named_parameters())
        self.base_params = [params[n] for n, _ in base_named]
        self.lora_params = [params[n] for n, _ in lora_named]
        self.optimizer = adamw(self.lora_params, spec.learning_rate)
        self.ppo = spec.ppo
        generation = GenerationLayout(tp)
        self.base_plan: ReshardPlan = plan_reshard(self.base_specs, self.layout, generation)
        # the adapter's shards go where the base's went: the same roles, whatever its own overlaps
        self.lora_plan: ReshardPlan = plan_reshard(self.lora_specs, self.layout, generation,
                                                   roles=self.base_plan.roles)
        fsdp_groups = [dist.new_group([self.layout.rank(d, f) for f in range(self.layout.fsdp)])
                       for d in range(self.layout.dp)] if self.layout.dp > 1 else [None]
        fsdp_group = fsdp_groups[self.layout.coords(rank)[0]]
        self.replica_ranks = next(r for r in self.base_plan.replicas() if rank in r)
        groups = [dist.new_group(r) if tp > 1 else None for r in self.base_plan.replicas()]
        self.tp_group = groups[self.base_plan.replicas().index(self.replica_ranks)]
        self.base_resharder = Resharder(self.base_plan, rank, fsdp_group)
        self.lora_resharder = Resharder(self.lora_plan, rank, fsdp_group)
        role = self.base_plan.roles[rank]
        return {"replica": role.replica, "tp_rank": role.rank, "ranks": self.replica_ranks}

    # -- transitions -----------------------------------------------------------------------------
    def to_generation(self, method: str = "hybrid", keep_base: bool = True) -> dict[str, Any]:
        """Switch to generation: the base (the first time, or every time without `keep_base`) and the
        adapter's tensors into tensor-parallel shards; the adapter goes in under a new name.
        `method`: hybrid (the plan) or allgather (the baseline)."""
        start = time.perf_counter()
        self.policy.eval()
        self.keep_base = keep_base
        stats: dict[str, Any] = {"base": None}
        with torch.no_grad():
            if self.engine is None:
                shards = [_local(p) for p in self.base_params]
                weights, base = self._move(self.base_resharder, shards, method)
                stats["base"] = asdict(base)
                names = [s.name for s in self.base_specs]
                role = self.base_plan.roles[self.rank]
                self.engine = TensorParallelLlama(
                    self.model_config, dict(zip(names, weights, strict=True)), role.rank,
                    self.base_plan.generation.tp, self.tp_group, self.replica_ranks)
                if not keep_base:
                    self._release_training(weights)
            lora, adapter = self._move(self.lora_resharder, [_local(p) for p in self.lora_params], method)
            self.syncs += 1
            name = f"{self.spec.adapter_prefix}-sync{self.syncs}"
            self.engine.load_adapter(name, {s.name: t for s, t in zip(self.lora_specs, lora, strict=True)},
                                     self.lora_scale)
            self.adapter_name = name
        stats |= {"adapter": asdict(adapter), "adapter_name": name, "seconds": time.perf_counter() - start,
                  "generation_bytes": sum(t.numel() * t.element_size() for t in self.engine.weights.values()),
                  "training_resident_bytes": self._training_bytes()}
        return stats

    def _move(self, resharder: Resharder, shards: list[torch.Tensor],
              method: str) -> tuple[list[torch.Tensor], TransitionStats]:
        if method == "hybrid":
            return resharder.reshard(shards)
        if method == "allgather":
            return resharder.allgather(shards)
        raise ValueError(f"transition method {method!r} is not hybrid or allgather")

    def _release_training(self, weights: list[torch.Tensor]) -> None:
        """Give back the storage of every training shard that the generation copy contains."""
        for index, parameter in enumerate(self.base_params):
            plan = self.base_plan
            if contains(plan.generation_box(self.rank, index), plan.training_box(self.rank, index)):
                storage = _local(parameter).untyped_storage()
                self.released.append((index, storage.nbytes()))
                storage.resize_(0)

    def _training_bytes(self) -> int:
        seen: dict[int, int] = {}
        for parameter in self.base_params:
            storage = _local(parameter).untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())

    def to_training(self) -> dict[str, Any]:
        """Back to training: without `keep_base`, free the generation copy after restoring the training
        shards it held."""
        start = time.perf_counter()
        if self.released and self.engine is not None:
            names = [s.name for s in self.base_specs]
            with torch.no_grad():
                for index, nbytes in self.released:
                    local = _local(self.base_params[index])
                    local.untyped_storage().resize_(nbytes)
                    plan = self.base_plan
                    local.copy_(cut(self.engine.weights[names[index]], plan.generation_box(self.rank, index),
                                    plan.training_box(self.rank, index)))
            self.released = []
        if not self.keep_base:
            self.engine = None  # the generation copy (base and adapters) is freed
            self.adapter_name = None
        self.policy.train()
        return {"seconds": time.perf_counter() - start, "training_resident_bytes": self._training_bytes(),
                "generation_resident": self.engine is not None}

    # -- generation ------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
                 seed: int = 0, adapter: str | None = "current") -> list[dict[str, Any]]:
        """Completions from this device's engine replica (every rank of the replica gets the same call);
        `adapter`: "current" (the last synced), a loaded name, or None (the base)."""
        if self.engine is None:
            raise RuntimeError("to_generation first: the worker is in training mode")
        name = self.adapter_name if adapter == "current" else adapter
        out = self.engine.generate(prompts, max_new_tokens, temperature, name, seed)
        return [{"token_ids": c.token_ids, "logprobs": c.logprobs, "finish_reason": c.finish_reason}
                for c in out]

    # -- inspection (tests, benchmarks) ------------------------------------------------------------
    def full_weights(self) -> dict[str, torch.Tensor]:
        """Every parameter's full tensor (a collective: every device calls it)."""
        out = {}
        for spec, parameter in zip(self.base_specs + self.lora_specs, self.base_params + self.lora_params,
                                   strict=True):
            out[spec.name] = _full(parameter).detach().cpu().clone()
        return out

    def generation_shards(self) -> dict[str, Any]:
        """This device's generation role and its shards (base and current adapter)."""
        if self.engine is None or self.adapter_name is None:
            raise RuntimeError("to_generation first")
        role = self.base_plan.roles[self.rank]
        return {"tp_rank": role.rank, "replica": role.replica, "tp": self.base_plan.generation.tp,
                "base": {k: v.clone() for k, v in self.engine.weights.items()},
                "adapter": {k: v.clone() for k, v in self.engine.adapters[self.adapter_name][0].items()}}

    def plan_summary(self) -> dict[str, Any]:
        plan = self.base_plan
        return {"roles": [(r.replica, r.rank) for r in plan.roles], "replicas": plan.replicas(),
                "model_bytes": sum(s.nbytes for s in plan.specs),
                "adapter_bytes": sum(s.nbytes for s in self.lora_plan.specs),
                "received_bytes": [plan.received_bytes(r) for r in range(plan.world)],
                "adapter_received_bytes": [self.lora_plan.received_bytes(r) for r in range(plan.world)],
                "generation_bytes": [plan.generation_bytes(r) for r in range(plan.world)],
                "redundant_bytes": [plan.redundant_bytes(r) for r in range(plan.world)]}

    # -- PPO on the FSDP policy ---------------------------------------------------------------------
    def _batch(self, rollouts: list[tuple[list[int], list[int]]]) -> Any:
        return pack([Sample(prompt, (completion,)) for prompt, completion in rollouts]).to(self.device)

    def _logprobs(self, batch: Any) -> torch.Tensor:
        """Token log-probs of the batch's completions, through the FSDP root (so that every FSDP unit,
        the embedding and the tied LM head included, is gathered on the way)."""
        from online_rl.algos.attention import packed_attention

        with packed_attention(self.model_config), autocast(self.spec.model.compute,
                                                           self.device.split(":")[0]):
            logits = self.policy(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False,
                                 packed_layout=batch.attention, logits_to_keep=batch.predict_at).logits[0]
        logits = logits.float()
        return logits.gather(1, batch.targets.unsqueeze(1)).squeeze(1) - torch.logsumexp(logits, dim=-1)

    def score(self, rollouts: list[tuple[list[int], list[int]]]) -> list[tuple[list[float], list[float]]]:
        """Per rollout: the current policy's (pi_old) and the reference's (the base) token log-probs."""
        batch = self._batch(rollouts)
        self.policy.eval()
        with torch.no_grad():
            old = self._logprobs(batch)
            with self.policy.disable_adapter():
                ref = self._logprobs(batch)
        self.policy.train()
        lengths = batch.lengths.tolist()
        return [(o.tolist(), r.tolist()) for o, r in zip(old.split(lengths), ref.split(lengths), strict=True)]

    def ppo_train(self, rollouts: list[tuple[list[int], list[int]]], old: list[list[float]],
                  advantages: list[list[float]], behaviour: list[list[float]],
                  ref: list[list[float]] | None = None) -> dict[str, float]:
        """`ppo_epochs` clipped-surrogate steps on this device's rollouts; FSDP averages the gradients.
        With `kl_beta` > 0 (GRPO's in-loss KL) and the reference's log-probs `ref`, each token also
        pays kl_beta * k3(pi, ref), weighed by pi / pi_old with `kl_ratio_correction`."""
        start = time.perf_counter()
        batch = self._batch(rollouts)

        def flat(rows: list[list[float]]) -> torch.Tensor:
            return torch.tensor([x for row in rows for x in row], dtype=torch.float32, device=self.device)

        old_padded, mask = batch.padded(flat(old))
        adv_padded, _ = batch.padded(flat(advantages))
        behaviour_padded, _ = batch.padded(flat(behaviour))
        beta = self.spec.kl_beta if ref is not None else 0.0
        ref_padded = batch.padded(flat(ref))[0] if ref is not None and beta > 0 else None
        metrics: dict[str, float] = {}
        for _ in range(self.spec.epochs):
            logprobs, _ = batch.padded(self._logprobs(batch))
            loss = policy_loss(logprobs, old_padded, adv_padded, mask, self.ppo, behaviour_padded)
            total = loss.loss
            if ref_padded is not None:
                kl = kl_penalty(logprobs, ref_padded, "k3")
                if self.spec.kl_ratio_correction:
                    kl = kl * torch.exp((logprobs - old_padded).clamp(-20.0, 20.0))
                kl_term = aggregate(kl, mask, self.ppo.aggregation)
                total = total + beta * kl_term
                metrics["kl_in_loss"] = kl_term.item()
            total.backward()
            norm = clipped_step(self.optimizer, self.lora_params)
            metrics |= {"ppo_loss": loss.loss.item(), "ppo_clip_fraction": loss.clip_fraction.item(),
                        "ppo_approx_kl": loss.approx_kl.item(), "grad_norm": norm,
                        "ppo_truncated_fraction": loss.truncated_fraction.item()}
        return metrics | {"step_s": time.perf_counter() - start}

    def avoid_cores(self, cores: set[int]) -> list[int]:
        """Bind this device's threads to the CPU cores outside `cores` (where the vLLM engine runs);
        unchanged when no core would remain. The cores kept."""
        import os

        from online_rl.hardware import pin_process

        if not hasattr(os, "sched_getaffinity"):
            return []
        return sorted(pin_process(os.sched_getaffinity(0) - cores))

    def adapter_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
        """The adapter's full tensors under PEFT's saved names and its LoRA config as a dict, for an
        engine that installs adapters from memory (a collective: every device calls it; rank 0 answers,
        the others None). Nothing is written to disk."""
        state = {name.replace(".default.", "."): _full(p).detach().cpu().contiguous()
                 for name, p in self.policy.named_parameters() if p.requires_grad}
        if self.rank != 0:
            return None
        config = self.policy.active_peft_config.to_dict()
        return state, {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}

    def adapter_files(self) -> dict[str, bytes] | None:
        """The adapter as a PEFT folder's files (a collective: every device calls it; rank 0 answers,
        the others None). Bytes travel to the driver, which may run on another node."""
        import tempfile
        from pathlib import Path

        from safetensors.torch import save_file

        from online_rl.registry.lineage import folder_files

        state = {name.replace(".default.", "."): _full(p).detach().cpu().contiguous()
                 for name, p in self.policy.named_parameters() if p.requires_grad}
        if self.rank != 0:
            return None
        with tempfile.TemporaryDirectory(prefix="orl-adapter-") as tmp:
            save_file(state, str(Path(tmp) / "adapter_model.safetensors"))
            self.policy.active_peft_config.save_pretrained(tmp)  # the trained adapter's LoRA config
            return folder_files(Path(tmp))
