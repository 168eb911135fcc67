"""What a training worker is built from, as frozen dataclasses that cross the Ray boundary.

The settings (`online_rl.config`) are what a user writes; a spec is what one worker needs, derived
from them in one place (`trainer_specs`, `hybrid_specs`) and checked there. The algorithm configs in
a spec are `online_rl.algos`' own dataclasses built from the settings, so a default lives once: in
the settings when a user may change it, in the algorithm's config otherwise. A worker receives its
spec and reads typed fields, never string keys.

`build_lora` is the one place a worker turns a `ModelSpec` into a model: seed, threads, the base
from disk, a fresh LoRA adapter on it; `adamw` and `clipped_step` are its optimizer and step. The
policy, critic, reward and hybrid workers all use them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Self

import torch

from online_rl.algos import DPOConfig, KLControlConfig, KTOConfig, PPOConfig, RewardModelConfig
from online_rl.algos.batch import Precision
from online_rl.algos.policy import LoraSpec, lora_policy

if TYPE_CHECKING:
    from online_rl.config import Settings

__all__ = ["CriticSpec", "HybridSpec", "LearnerSpec", "ModelSpec", "PolicySpec", "RewardSpec", "adamw",
           "build_lora", "clipped_step", "hybrid_specs", "set_learning_rate", "trainer_specs"]

# Each worker seeds its adapter's initialisation from the run's seed and its role, so the policy,
# critic and reward model start from different adapters that a rerun reproduces.
SEED_OFFSETS = {"policy": 0, "critic": 1, "reward": 2}


@dataclass(frozen=True)
class ModelSpec:
    """The base model, the adapter's shape, the seed and the precision (`auto` until resolved on
    the worker's device by `online_rl.ray_runtime.resolve_precision_on`)."""

    model_dir: str
    lora: LoraSpec
    seed: int
    precision: Literal["auto", "fp32", "bf16"]

    def __post_init__(self) -> None:
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"precision={self.precision!r} is not one of auto, fp32, bf16")

    def resolved(self, precision: str) -> ModelSpec:
        return dataclasses.replace(self, precision=precision)  # type: ignore[arg-type]  # checked above

    @property
    def compute(self) -> Precision:
        """The resolved precision the worker computes in."""
        if self.precision == "auto":
            raise ValueError("ModelSpec.precision is still `auto`: resolve it on the worker's device first "
                             "(online_rl.ray_runtime.resolve_precision_on)")
        return self.precision


@dataclass(frozen=True)
class LearnerSpec:
    """What every trained worker has: its model and its optimizer's rate."""

    model: ModelSpec
    learning_rate: float

    def resolved(self, precision: str) -> Self:
        """This spec with the model's precision decided (`auto` resolved on the device)."""
        return dataclasses.replace(self, model=self.model.resolved(precision))


@dataclass(frozen=True)
class CriticSpec(LearnerSpec):
    """PPO's value model; `epochs` optimizer steps over each batch."""

    epochs: int
    ppo: PPOConfig = field(default_factory=PPOConfig)


@dataclass(frozen=True)
class PolicySpec(CriticSpec):
    """A policy worker of the feedback flow: DPO and KTO on pairs and thumbs, PPO on rollouts."""

    dpo: DPOConfig = field(default_factory=DPOConfig)
    kto: KTOConfig = field(default_factory=KTOConfig)
    anchor_kl_coef: float = 0.0  # the cold-start KL term's weight


@dataclass(frozen=True)
class HybridSpec(CriticSpec):
    """A hybrid worker: the policy trained under FSDP that also generates (tensor-parallel)."""

    aligned: bool = True  # shard boundaries on the tensor-parallel cuts
    adapter_prefix: str = "policy"  # the generation engine's adapter names: <prefix>-sync<n>
    kl_beta: float = 0.0  # GRPO's k3 KL to the reference inside the loss (critic-free `beta`)
    kl_ratio_correction: bool = True  # that KL weighed by pi / pi_old per token


@dataclass(frozen=True)
class RewardSpec(LearnerSpec):
    """The reward model that keeps learning from live preference pairs (a replay window)."""

    window: int
    batch: int
    loss: RewardModelConfig = field(default_factory=lambda: RewardModelConfig(center_coef=0.01))


def _model(settings: Settings, precision: Literal["auto", "fp32", "bf16"]) -> ModelSpec:
    trainer = settings.trainer
    lora = LoraSpec(rank=trainer.lora_rank, alpha=trainer.lora_alpha, targets=tuple(trainer.lora_targets))
    return ModelSpec(str(settings.model_dir), lora, trainer.seed, precision)


def trainer_specs(settings: Settings) -> tuple[PolicySpec, CriticSpec]:
    """The feedback flow's policy workers and PPO critic, from `settings.trainer`."""
    trainer = settings.trainer
    model = _model(settings, trainer.precision)
    ppo = PPOConfig(kl=KLControlConfig(coef=trainer.kl_coef, target=trainer.kl_target))
    kto = KTOConfig(beta=trainer.beta, desirable_weight=trainer.kto_desirable_weight,
                    undesirable_weight=trainer.kto_undesirable_weight)
    policy = PolicySpec(model, trainer.learning_rate, trainer.ppo_epochs, ppo, DPOConfig(beta=trainer.beta),
                        kto, trainer.cold_start_kl_coef)
    return policy, CriticSpec(model, trainer.critic_learning_rate, trainer.ppo_epochs, ppo)


def hybrid_specs(settings: Settings) -> tuple[HybridSpec, CriticSpec, RewardSpec]:
    """The rollout flow's hybrid workers, critic and reward model: the adapter's shape and seed from
    `settings.trainer`, the rest from `settings.hybrid`."""
    hybrid = settings.hybrid
    model = _model(settings, hybrid.precision)
    clipping: dict[str, Any] = {}
    if hybrid.critic_free is not None:  # the critic-free loss's clip range and aggregation
        clipping = {"clip_low": hybrid.critic_free.clip_low, "clip_high": hybrid.critic_free.clip_high,
                    "aggregation": hybrid.critic_free.loss_aggregation}
    kl = KLControlConfig(coef=hybrid.kl_coef, target=hybrid.kl_target, horizon=hybrid.kl_horizon)
    ppo = PPOConfig(kl=kl, behaviour_cap=hybrid.behaviour_cap, **clipping)
    in_loss = hybrid.critic_free
    policy = HybridSpec(model, hybrid.learning_rate, hybrid.ppo_epochs, ppo, hybrid.aligned,
                        settings.mlflow.registered_model, in_loss.beta if in_loss else 0.0,
                        in_loss.kl_ratio_correction if in_loss else True)
    critic = CriticSpec(model, hybrid.critic_learning_rate, hybrid.ppo_epochs, ppo)
    reward = RewardSpec(model, hybrid.reward_learning_rate, hybrid.reward_window, hybrid.reward_batch)
    return policy, critic, reward


def build_lora(spec: ModelSpec, role: str, threads: int = 1, cast: bool = True) -> tuple[Any, Any]:
    """(the LoRA model, the base's HF config): `threads` torch threads, the seed of `role`, the base
    in float32 from `spec.model_dir`, a fresh adapter of `spec.lora`. `cast`: store the frozen base
    in the resolved precision (off where FSDP shards the weights and autocast does the casting)."""
    from transformers import AutoModelForCausalLM

    precision = spec.compute
    torch.set_num_threads(max(1, threads))
    torch.manual_seed(spec.seed + SEED_OFFSETS[role])
    base = AutoModelForCausalLM.from_pretrained(spec.model_dir, dtype=torch.float32)
    model = lora_policy(base, spec.lora, precision if cast else "fp32")
    return model, base.config


def adamw(parameters: Iterable[torch.Tensor], learning_rate: float) -> torch.optim.AdamW:
    return torch.optim.AdamW(list(parameters), lr=learning_rate)


def clipped_step(optimizer: torch.optim.Optimizer, parameters: Iterable[torch.Tensor],
                 max_norm: float = 1.0) -> float:
    """Clip the gradients to `max_norm`, step, clear them; the norm before clipping (of the whole
    tensors, where FSDP shards them)."""
    norm: Any = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def set_learning_rate(optimizer: torch.optim.Optimizer, learning_rate: float) -> None:
    """The configured rate wins over a restored checkpoint's."""
    for group in optimizer.param_groups:
        group["lr"] = learning_rate
