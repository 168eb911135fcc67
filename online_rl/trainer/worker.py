"""The policy worker: a LoRA policy and its optimizer, trained one step at a time.

Runs inside a Ray actor (`WorkerGroup` creates one per data-parallel rank); it receives token ids,
calls the pure losses of `online_rl.algos`, and hands back metric sums, snapshots for checkpoints and
adapter folders for publishing. With several ranks, each trains its `Shard` of the batch and the
gradients are summed over torch.distributed (gloo on CPU, NCCL on GPU) before the optimizer step, so
every rank holds the same adapter and the update is the one a single worker would make. It knows
nothing about the bus, MLflow or when to publish.
"""

from __future__ import annotations

import math
import tempfile
import time
from contextlib import nullcontext
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from online_rl.algos import Sample, forward, pack, policy_loss
from online_rl.algos.batch import (
    anchor_kl_batch_loss,
    autocast,
    dpo_batch_loss,
    implicit_rewards,
    kto_batch_loss,
    reference_logprobs,
)
from online_rl.algos.logprobs import reference_policy
from online_rl.algos.policy import trainable_parameters
from online_rl.ports import free_port
from online_rl.registry.lineage import folder_files, write_folder
from online_rl.trainer.checkpoint import Checkpoint, capture_rng
from online_rl.trainer.samples import Shard
from online_rl.trainer.spec import PolicySpec, adamw, build_lora, set_learning_rate

__all__ = ["PolicyWorker"]

_ANCHOR, _BASELINE = "anchor", "published"


class PolicyWorker:
    """One copy of the policy (base + LoRA adapter) with its AdamW optimizer."""

    def __init__(self, spec: PolicySpec, threads: int = 1, device: str = "cpu") -> None:
        self.spec = spec
        self.policy, base_config = build_lora(spec.model, "policy", threads)
        self.precision = spec.model.compute
        self.policy.to(device).train()
        self.parameters = trainable_parameters(self.policy)
        self.optimizer = adamw(self.parameters.values(), spec.learning_rate)
        self.dpo, self.kto, self.ppo = spec.dpo, spec.kto, spec.ppo
        self.anchor_kl_coef = spec.anchor_kl_coef
        self.max_tokens = int(base_config.max_position_embeddings)
        self.vocab = int(base_config.vocab_size)  # the embedding's rows
        self.device = device
        self.world = 1
        self.anchor: str | None = None  # the frozen adapter the KL term holds to; None: the base
        self.has_baseline = False  # a frozen copy of the last published adapter, for evaluation

    # -- data parallelism -----------------------------------------------------------------------
    def rendezvous(self) -> tuple[str, int]:
        """Rank 0's address and a free port for the process group."""
        import ray

        return ray.util.get_node_ip_address(), free_port("")

    def join(self, address: str, port: int, rank: int, world: int) -> None:
        """Join the process group of `world` ranks (all ranks call this at once)."""
        backend = "nccl" if self.device.startswith("cuda") else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank,
                                world_size=world, timeout=timedelta(minutes=10))
        self.world = world

    def _sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    # -- training -------------------------------------------------------------------------------
    def train_step(self, shard: Shard) -> dict[str, float]:
        """One optimizer step. Returns this shard's metric *sums* (the group adds them up)."""
        start = time.perf_counter()
        sums: dict[str, float] = {"pairs": len(shard.pairs), "thumbs": len(shard.thumbs)}
        loss = torch.zeros((), device=self.device)
        if shard.pairs:
            out = dpo_batch_loss(self.policy, shard.pairs, self.dpo, self.precision, self.anchor)
            loss = loss + out.loss * (len(shard.pairs) / shard.total)
            count = len(shard.pairs)
            sums.update(dpo_loss=out.loss.item() * count, dpo_accuracy=out.accuracy.item() * count,
                        dpo_margin=out.margin.item() * count)
        if shard.total_thumbs >= 2 and self.world > 1 and not shard.thumbs:
            self._sum(torch.zeros((), device=self.device))  # this rank's share of KTO's reference point
        if shard.thumbs:
            config = self.kto if shard.kto_weights is None else replace(
                self.kto, desirable_weight=shard.kto_weights[0], undesirable_weight=shard.kto_weights[1])
            kto = kto_batch_loss(self.policy, shard.thumbs, config, self.precision, shard.partners,
                                 self._thumbs_mean(shard.total_thumbs), self.anchor)
            loss = loss + kto.loss * (len(shard.thumbs) / shard.total)
            count = len(shard.thumbs)
            sums.update(kto_loss=kto.loss.item() * count, kto_reward=kto.rewards.mean().item() * count,
                        kto_kl=kto.reference_point.item() * count)
        coef = self.anchor_kl_coef if shard.anchor_kl_coef is None else shard.anchor_kl_coef
        if shard.anchors and coef > 0:
            # the cold-start KL term: this shard's share of the whole batch's per-token mean
            held = anchor_kl_batch_loss(self.policy, shard.anchors, self.precision, self.anchor)
            loss = loss + held.total * (coef / shard.total_anchor_tokens)
            sums.update(anchor_kl=held.total.item(), anchor_tokens=held.tokens)
        if loss.requires_grad:
            loss.backward()
        grad_norm = self._reduce_gradients()
        if not self._apply(grad_norm, loss.item()):
            sums["nonfinite"] = 1.0
        sums.update(loss=loss.item(), grad_norm=grad_norm, step_s=time.perf_counter() - start,
                    tokens=sum(len(p) + len(c) + len(r) for p, c, r in shard.pairs)
                    + sum(len(p) + len(c) for p, c, _ in shard.thumbs)
                    + sum(len(p) + len(c) for p, c in shard.anchors))
        return sums

    def _thumbs_mean(self, total: int) -> Any:
        if self.world == 1 or total < 2:
            return None

        def mean(log_ratios: torch.Tensor) -> torch.Tensor:
            return self._sum(log_ratios.float().sum()) / total

        return mean

    def _apply(self, grad_norm: float, loss: float) -> bool:
        """Take the optimizer step unless the gradient (all-reduced, so the same on every rank) or any
        rank's loss is not finite: a NaN or infinite loss must never reach the adapter. Whether it
        stepped; every rank decides the same."""
        bad = torch.tensor(0.0 if math.isfinite(loss) else 1.0, device=self.device)
        finite = math.isfinite(grad_norm) and self._sum(bad).item() == 0
        if finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return finite

    def _reduce_gradients(self) -> float:
        """Sum the gradients over the ranks (one flat all-reduce), then clip them to norm 1."""
        parameters = list(self.parameters.values())
        if self.world > 1:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
            flat = self._sum(torch.cat([g.reshape(-1) for g in grads]))
            for p, chunk in zip(parameters, flat.split([g.numel() for g in grads]), strict=True):
                p.grad = chunk.view_as(p).clone()
        return float(torch.nn.utils.clip_grad_norm_(parameters, 1.0))

    # -- PPO ------------------------------------------------------------------------------------
    def ppo_score(self, rollouts: list[Any]) -> list[tuple[list[float], list[float]]]:
        """Per rollout, the current policy's (pi_old) and the reference's token log-probs, no autograd."""
        if not rollouts:
            return []
        batch = pack([Sample(prompt, (completion,)) for prompt, completion, _, _ in rollouts]).to(self.device)
        self.policy.eval()
        try:
            with torch.no_grad(), autocast(self.precision, self.device.split(":")[0]):
                old = forward(self.policy, batch).token_logprobs.float()
            ref = reference_logprobs(self.policy, batch, self.precision, self.anchor).token_logprobs.float()
        finally:
            self.policy.train()
        lengths = batch.lengths.tolist()
        return [(o.tolist(), r.tolist()) for o, r in zip(old.split(lengths), ref.split(lengths), strict=True)]

    def ppo_train(self, shard: Shard, old: list[list[float]],
                  advantages: list[list[float]]) -> dict[str, float]:
        """`ppo_epochs` optimizer steps of the clipped surrogate on this shard's rollouts (behaviour
        weights from the served log-probs); every rank steps together, even with an empty shard."""
        start = time.perf_counter()
        tokens = sum(len(completion) for _, completion, _, _ in shard.rollouts)
        sums: dict[str, float] = {"rollouts": len(shard.rollouts), "tokens": tokens}
        if shard.rollouts:
            batch = pack([Sample(p, (c,)) for p, c, _, _ in shard.rollouts]).to(self.device)
            served = [b if b is not None else o for (_, _, b, _), o in zip(shard.rollouts, old, strict=True)]
            old_padded, mask = batch.padded(self._flat(old))
            adv_padded, _ = batch.padded(self._flat(advantages))
            behaviour, _ = batch.padded(self._flat(served))
            # each rank's share of the whole batch's mean, so the summed gradients are one worker's
            weight = (tokens / shard.total_rollout_tokens if self.ppo.aggregation == "token-mean"
                      else len(shard.rollouts) / shard.total_rollouts)
        for _epoch in range(self.spec.epochs):
            if shard.rollouts:
                with autocast(self.precision, self.device.split(":")[0]):
                    out = forward(self.policy, batch)
                logprobs, _ = batch.padded(out.token_logprobs)
                loss = policy_loss(logprobs, old_padded, adv_padded, mask, self.ppo, behaviour)
                (loss.loss * weight).backward()
                for name, value in (("ppo_loss", loss.loss.item() * weight), ("ppo_clip_fraction",
                                    loss.clip_fraction.item() * tokens), ("ppo_approx_kl",
                                    loss.approx_kl.item() * tokens), ("ppo_truncated_fraction",
                                    loss.truncated_fraction.item() * tokens)):
                    sums[name] = value  # the last epoch's
            sums["grad_norm"] = self._reduce_gradients()
            if not self._apply(sums["grad_norm"], sums.get("ppo_loss", 0.0)):
                sums["nonfinite"] = 1.0
                break  # no later epoch either (the earlier ones' steps were finite and stay)
        sums["step_s"] = time.perf_counter() - start
        return sums

    def _flat(self, rows: list[list[float]]) -> torch.Tensor:
        return torch.tensor([x for row in rows for x in row], dtype=torch.float32, device=self.device)

    # -- reference and evaluation ---------------------------------------------------------------
    def set_anchor(self, files: dict[str, bytes] | None) -> None:
        """Make the adapter in `files` (a PEFT folder's files) the frozen reference; None: the base."""
        self._load_frozen(_ANCHOR, files)
        self.anchor = _ANCHOR if files is not None else None

    def set_baseline(self, files: dict[str, bytes] | None) -> None:
        """The last published adapter (a PEFT folder's files), scored next to the current one."""
        self._load_frozen(_BASELINE, files)
        self.has_baseline = files is not None

    def _load_frozen(self, name: str, files: dict[str, bytes] | None) -> None:
        if name in self.policy.peft_config:
            self.policy.delete_adapter(name)
        if files is not None:
            # PEFT draws a fresh adapter's init from the global RNG: keep the training stream intact
            with (tempfile.TemporaryDirectory(prefix="orl-adapter-") as folder,
                  torch.random.fork_rng(devices=[])):
                self.policy.load_adapter(str(write_folder(folder, files)), adapter_name=name,
                                         is_trainable=False)
            self.policy.to(self.device)
        self.policy.set_adapter("default")
        self.policy.train()  # load_adapter(is_trainable=False) puts the whole model in eval mode

    def evaluate(self, pairs: list[Any], thumbs: list[Any]) -> dict[str, float]:
        """Held-out scores (beta * log-ratio margins against the reference) of the current adapter and,
        when there is one, of the last published adapter on the same samples."""
        self.policy.eval()
        try:
            current = self._scores(pairs, thumbs)
            result = {"eval_score": current.mean().item(), "eval_samples": float(len(current))}
            if pairs:
                result["eval_accuracy"] = (current[: len(pairs)] > 0).float().mean().item()
            if self.has_baseline:
                with reference_policy(self.policy, _BASELINE):  # the baseline as the policy side
                    result["eval_baseline_score"] = self._scores(pairs, thumbs).mean().item()
            return result
        finally:
            self.policy.train()

    def _scores(self, pairs: list[Any], thumbs: list[Any], chunk: int = 16) -> torch.Tensor:
        """Held-out scores, pairs first, a chunk of samples per forward pass (bounded memory)."""
        parts = [implicit_rewards(self.policy, pairs[i:i + chunk], [], self.dpo.beta, self.precision,
                                  self.anchor) for i in range(0, len(pairs), chunk)]
        parts += [implicit_rewards(self.policy, [], thumbs[i:i + chunk], self.dpo.beta, self.precision,
                                   self.anchor) for i in range(0, len(thumbs), chunk)]
        return torch.cat(parts)

    def answer_greedy(self, prompts: list[list[int]], max_new_tokens: int, pad_id: int, eos_id: int,
                      base: bool = False) -> list[list[int]]:
        """Greedy answers (token ids, the end-of-sequence token dropped) to chat-templated `prompts`,
        by the current adapter or (`base`) by the base model, in the training precision: the ability
        gate's probe (online_rl/trainer/gate.py)."""
        return [row[:end] for row, end in self._generate(prompts, max_new_tokens, pad_id, eos_id, base)]

    def answer_sampled(self, prompts: list[list[int]], samples: int, max_new_tokens: int, pad_id: int,
                       eos_id: int, temperature: float, seed: int) -> list[list[list[int]]]:
        """`samples` answers to each of the chat-templated `prompts`, sampled at `temperature` by the
        current adapter (token ids, ending with the end-of-sequence token when the answer ended):
        fact rehearsal's (online_rl/trainer/rehearsal.py). Seeded by `seed`, outside the training's
        random stream (dropout's draws stay what a run without rehearsal would make)."""
        repeated = [p for p in prompts for _ in range(samples)]
        with torch.random.fork_rng(devices=[self.device] if self.device.startswith("cuda") else []):
            torch.manual_seed(seed)
            rows = self._generate(repeated, max_new_tokens, pad_id, eos_id, False, temperature)
        answers = [row[: end + 1] if end < len(row) else row for row, end in rows]
        return [answers[i * samples:(i + 1) * samples] for i in range(len(prompts))]

    def _generate(self, prompts: list[list[int]], max_new_tokens: int, pad_id: int, eos_id: int,
                  base: bool, temperature: float | None = None) -> list[tuple[list[int], int]]:
        """(the generated ids, where the first stop token is or their length) for each prompt: greedy,
        or sampled at `temperature` over the whole distribution."""
        configured = getattr(getattr(self.policy, "generation_config", None), "eos_token_id", None)
        stops = [eos_id] + [t for t in (configured if isinstance(configured, list) else [configured])
                            if isinstance(t, int) and t != eos_id]  # e.g. an end-of-turn token too
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        sampling: dict[str, Any] = ({"do_sample": False} if temperature is None else
                                    {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0})
        self.policy.eval()
        try:
            with (torch.no_grad(), reference_policy(self.policy, None) if base else nullcontext(),
                  autocast(self.precision, self.device.split(":")[0])):
                out = self.policy.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                           pad_token_id=pad_id, eos_token_id=stops, **sampling)
        finally:
            self.policy.train()
        rows = []
        for row in out[:, width:].tolist():
            ends = [row.index(t) for t in stops if t in row]
            rows.append((row, min(ends) if ends else len(row)))
        return rows

    def reset_adapter(self, files: dict[str, bytes] | None, learning_rate: float) -> None:
        """Put the trained adapter back to `files` (a published version's PEFT folder files; None: the
        state that answers as the base, LoRA's B matrices zero) with a fresh optimizer at
        `learning_rate`: the ability gate's step back."""
        self._load_adapter(files)
        self.optimizer = adamw(self.parameters.values(), learning_rate)

    def shrink_adapter(self, files: dict[str, bytes] | None, keep: float) -> None:
        """Move the trained adapter back towards `files` (None: the base), keeping the share `keep` of
        each parameter's change since: the ability gate's partial step back. From the base (LoRA's B
        zero) that is exactly `keep` times the adapter's change of the weights. The optimizer's state
        stays."""
        if not 0 < keep < 1:
            raise ValueError(f"shrink_adapter: keep={keep} must lie in (0, 1)")
        trained = {name: parameter.detach().clone() for name, parameter in self.parameters.items()}
        self._load_adapter(files)
        with torch.no_grad():
            for name, parameter in self.parameters.items():
                parameter.add_(trained[name] - parameter, alpha=keep)

    def _load_adapter(self, files: dict[str, bytes] | None) -> None:
        """The adapter's parameters set to `files` (a published version's PEFT folder files; None: as
        the base, LoRA's B zero and A as it is)."""
        if files is None:
            with torch.no_grad():
                for name, parameter in self.parameters.items():
                    if "lora_B" in name:
                        parameter.zero_()
            return
        from peft import set_peft_model_state_dict
        from safetensors.torch import load as load_safetensors

        weights = load_safetensors(files["adapter_model.safetensors"])
        result = set_peft_model_state_dict(self.policy, weights, adapter_name="default")
        unexpected = list(getattr(result, "unexpected_keys", []))
        missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k and ".default" in k]
        if unexpected or missing:
            raise ValueError("the adapter to go back to does not fit the policy: "
                             f"unexpected {unexpected[:3]}, missing {missing[:3]}")

    def set_learning_rate(self, learning_rate: float) -> None:
        set_learning_rate(self.optimizer, learning_rate)

    # -- state ----------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The adapter, optimizer and random state, for a checkpoint."""
        return {
            "adapter": {name: p.detach().cpu().clone() for name, p in self.parameters.items()},
            "optimizer": self.optimizer.state_dict(),
            "rng": capture_rng(),
        }

    def restore(self, checkpoint: Checkpoint) -> None:
        checkpoint.restore_into(self.parameters, self.optimizer)
        set_learning_rate(self.optimizer, self.spec.learning_rate)

    def adapter_files(self) -> dict[str, bytes]:
        """The trained adapter as a PEFT folder's files (safetensors + adapter_config.json), by name:
        bytes travel back to the driver, which may run on another node than this worker."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="orl-adapter-") as tmp:
            self.policy.save_pretrained(tmp, safe_serialization=True, selected_adapters=["default"])
            return folder_files(Path(tmp))

    def context_length(self) -> int:
        return self.max_tokens

    def vocab_size(self) -> int:
        """Rows of the input embedding: a token id at or past this would index out of it."""
        return self.vocab

    def adapter(self) -> dict[str, torch.Tensor]:
        """The adapter's weights (for checking that the ranks agree)."""
        return {name: p.detach().cpu().clone() for name, p in self.parameters.items()}
