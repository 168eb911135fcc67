"""The policy worker: a LoRA policy and its optimizer, trained one step at a time.

Runs inside a Ray actor (the controller creates it); it receives token ids, calls the pure losses of
`online_rl.algos`, and hands back metrics, snapshots for checkpoints and adapter folders for
publishing. It knows nothing about the bus, MLflow or when to publish.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from online_rl.algos import DPOConfig, KTOConfig
from online_rl.algos.batch import dpo_batch_loss, kto_batch_loss
from online_rl.algos.policy import LoraSpec, lora_policy, trainable_parameters
from online_rl.trainer.checkpoint import Checkpoint, capture_rng

__all__ = ["PolicyWorker"]


class PolicyWorker:
    """One copy of the policy (base + LoRA adapter) with its AdamW optimizer."""

    def __init__(self, model_dir: str, config: dict[str, Any]) -> None:
        from transformers import AutoModelForCausalLM

        self.config = config
        torch.manual_seed(config["seed"])
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        spec = LoraSpec(rank=config["lora_rank"], alpha=config["lora_alpha"],
                        targets=tuple(config["lora_targets"]))
        self.precision = config["precision"]
        self.policy = lora_policy(base, spec, self.precision)
        self.policy.train()
        self.parameters = trainable_parameters(self.policy)
        self.optimizer = torch.optim.AdamW(list(self.parameters.values()), lr=config["learning_rate"])
        self.dpo = DPOConfig(beta=config["beta"])
        self.kto = KTOConfig(beta=config["beta"])
        self.max_tokens = int(base.config.max_position_embeddings)

    def train_step(self, pairs: list[Any], thumbs: list[Any]) -> dict[str, float]:
        """One optimizer step on DPO pairs and KTO thumbs together (each loss weighted by its share)."""
        start = time.perf_counter()
        total = len(pairs) + len(thumbs)
        metrics: dict[str, float] = {}
        loss = torch.zeros(())
        if pairs:
            out = dpo_batch_loss(self.policy, pairs, self.dpo, self.precision)
            loss = loss + out.loss * (len(pairs) / total)
            metrics.update(dpo_loss=out.loss.item(), dpo_accuracy=out.accuracy.item(),
                           dpo_margin=out.margin.item())
        if thumbs:
            kto = kto_batch_loss(self.policy, thumbs, self.kto, self.precision)
            loss = loss + kto.loss * (len(thumbs) / total)
            metrics.update(kto_loss=kto.loss.item(), kto_kl=kto.reference_point.item(),
                           kto_reward=kto.rewards.mean().item())
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(list(self.parameters.values()), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        tokens = (sum(len(p) + len(c) + len(r) for p, c, r in pairs)
                  + sum(len(p) + len(c) for p, c, _ in thumbs))
        metrics.update(loss=loss.item(), grad_norm=float(grad_norm), step_s=elapsed,
                       tokens_per_s=tokens / elapsed, samples_per_s=total / elapsed)
        return metrics

    def snapshot(self) -> dict[str, Any]:
        """The adapter, optimizer and random state, for a checkpoint."""
        return {
            "adapter": {name: p.detach().cpu().clone() for name, p in self.parameters.items()},
            "optimizer": self.optimizer.state_dict(),
            "rng": capture_rng(),
        }

    def restore(self, checkpoint: Checkpoint) -> None:
        checkpoint.restore_into(self.parameters, self.optimizer)
        for group in self.optimizer.param_groups:  # the configured rate wins over the checkpoint's
            group["lr"] = self.config["learning_rate"]

    def save_adapter(self, folder: str) -> None:
        """Write the adapter as a PEFT folder (safetensors + adapter_config.json)."""
        Path(folder).mkdir(parents=True, exist_ok=True)
        self.policy.save_pretrained(folder, safe_serialization=True)

    def context_length(self) -> int:
        return self.max_tokens
