"""A causal LM made ready to learn as a LoRA policy: the adapter trains, the base stays frozen.

With `precision="bf16"` the frozen base weights are stored in bfloat16 (half the memory, and the
fast bfloat16 matrix units without a cast at every call) while the adapter's weights, their
gradients and the optimizer state stay in float32; such a policy must then be run under
`online_rl.algos.batch.autocast("bf16")`, as the batch losses do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from online_rl.algos.batch import Precision
from online_rl.errors import ConfigError

__all__ = ["LoraSpec", "lora_policy", "trainable_parameters"]


@dataclass(frozen=True)
class LoraSpec:
    """The adapter's shape."""

    rank: int = field(default=8, metadata={"help": "LoRA rank r (1-256)."})
    alpha: int = field(default=16, metadata={"help": "LoRA scale numerator (scale = alpha / rank)."})
    dropout: float = field(default=0.0, metadata={"help": "Dropout on the adapter's input, in [0, 1)."})
    targets: Sequence[str] = field(
        default=("q_proj", "k_proj", "v_proj", "o_proj"), metadata={"help": "Modules to adapt."}
    )

    def __post_init__(self) -> None:
        if not 1 <= self.rank <= 256:
            raise ConfigError(f"lora.rank={self.rank} must lie in [1, 256], e.g. 8")
        if not self.alpha > 0:
            raise ConfigError(f"lora.alpha={self.alpha} must be > 0, e.g. 16")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"lora.dropout={self.dropout} must lie in [0, 1), e.g. 0.0")
        if not self.targets:
            raise ConfigError("lora.targets is empty: name the modules to adapt, e.g. q_proj, v_proj")


def lora_policy(model: Any, spec: LoraSpec, precision: Precision = "fp32") -> Any:
    """Wrap `model` with a fresh trainable LoRA adapter (PEFT) and freeze everything else."""
    from peft import LoraConfig, get_peft_model

    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision {precision!r} is not one of fp32, bf16 (resolve `auto` first: "
                         "online_rl.hardware.resolve_precision)")
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                        target_modules=list(spec.targets), task_type="CAUSAL_LM")
    policy = get_peft_model(model, config)
    if precision == "bf16":
        from peft.tuners.tuners_utils import BaseTunerLayer

        for parameter in policy.parameters():
            if not parameter.requires_grad:
                parameter.data = parameter.data.to(torch.bfloat16)
        # PEFT would cast each adapter input to float32 (the adapter's dtype) for autocast to cast it
        # straight back: two copies of the activations per adapted layer, measured at ~10% of a step.
        for module in policy.modules():
            if isinstance(module, BaseTunerLayer):
                module.cast_input_dtype_enabled = False  # type: ignore[assignment]
    return policy


def trainable_parameters(model: Any) -> dict[str, torch.Tensor]:
    """The adapter's parameters by name (what an optimizer steps and a checkpoint stores)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}
