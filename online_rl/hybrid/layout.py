"""The two layouts of the actor's weights: how training shards them and how generation splits them.

Training holds each parameter as FSDP does (torch FSDP2 `fully_shard`): the data-parallel replicas
each keep one copy, and inside a replica the `fsdp` ranks each keep a contiguous chunk along the
parameter's shard dimension (`torch.chunk` sizes: ceil(n / fsdp), the last ones shorter or empty).
Generation splits each parameter as vLLM's tensor parallelism splits a Llama: column-parallel
projections (q, k, v, gate, up) by output rows, row-parallel ones (o, down) by input columns, the
vocabulary (embedding, LM head) by rows, norms replicated; a projection's bias (Qwen-style attention
biases) follows its output rows, so a row-parallel layer's bias is replicated; key/value heads fewer than the
tensor-parallel size are replicated across the ranks that share them. A LoRA adapter follows its
layer: a column-parallel layer's B is split like the layer and its A replicated; a row-parallel
layer's A is split by columns and its B replicated.

Everything is a `Box`: one half-open range per dimension, so any two layouts intersect exactly.
Pure: no torch.distributed, no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from online_rl.errors import ConfigError

__all__ = [
    "Box",
    "GenerationLayout",
    "ParamSpec",
    "SplitKind",
    "TrainingLayout",
    "canonical_name",
    "chunk_range",
    "llama_specs",
]

SplitKind = Literal["column", "row", "vocab", "heads", "replicated"]
Box = tuple[tuple[int, int], ...]  # one [start, stop) per dimension


def chunk_range(size: int, parts: int, index: int) -> tuple[int, int]:
    """The [start, stop) of chunk `index` when `torch.chunk` cuts `size` into `parts` (FSDP2's split)."""
    step = math.ceil(size / parts) if size else 0
    start = min(index * step, size)
    return start, min(start + step, size)


def _even_range(size: int, parts: int, index: int, what: str) -> tuple[int, int]:
    if size % parts:
        raise ConfigError(f"{what}: dimension {size} does not split into hybrid.tp={parts} parts; choose a "
                          f"hybrid.tp that divides it")
    step = size // parts
    return index * step, (index + 1) * step


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: its full shape, element size, FSDP shard dimension and tensor-parallel split."""

    name: str
    shape: tuple[int, ...]
    itemsize: int = 4
    train_dim: int = 0  # the dimension FSDP chunks
    split: SplitKind = "replicated"
    heads: int = 0  # for split="heads": the number of heads along dimension 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def full(self) -> Box:
        return tuple((0, n) for n in self.shape)

    def check_training(self, fsdp: int) -> None:
        """FSDP2 shards a dimension other than 0 only evenly."""
        if self.train_dim > 0 and self.shape[self.train_dim] % fsdp:
            raise ConfigError(f"{self.name}: hybrid.fsdp={fsdp} must divide its dimension {self.train_dim} "
                              f"({self.shape[self.train_dim]}) to shard it aligned with generation; choose "
                              "such a hybrid.fsdp, or set hybrid.aligned=false")

    def training_box(self, fsdp: int, index: int) -> Box:
        """The slice FSDP rank `index` of `fsdp` holds."""
        box = list(self.full())
        box[self.train_dim] = chunk_range(self.shape[self.train_dim], fsdp, index)
        return tuple(box)

    def generation_box(self, tp: int, rank: int) -> Box:
        """The slice tensor-parallel rank `rank` of `tp` serves with."""
        box = list(self.full())
        if self.split == "replicated" or tp == 1:
            return tuple(box)
        if self.split in ("column", "vocab"):
            box[0] = (_even_range(self.shape[0], tp, rank, self.name) if self.split == "column"
                      else chunk_range(self.shape[0], tp, rank))
        elif self.split == "row":
            box[1] = _even_range(self.shape[1], tp, rank, self.name)
        else:  # heads, replicated across ranks when there are fewer heads than ranks
            size = self.shape[0] // self.heads
            if self.heads >= tp:
                first, last = _even_range(self.heads, tp, rank, f"{self.name} ({self.heads} heads)")
            else:
                if tp % self.heads:
                    raise ConfigError(f"{self.name}: {self.heads} key/value heads cannot be shared evenly by "
                                      f"hybrid.tp={tp}; choose a multiple of {self.heads}")
                first = rank * self.heads // tp
                last = first + 1
            box[0] = (first * size, last * size)
        return tuple(box)


@dataclass(frozen=True)
class TrainingLayout:
    """`dp` data-parallel replicas of `fsdp` FSDP shards; rank r is replica r // fsdp, shard r % fsdp."""

    dp: int = 1
    fsdp: int = 1

    def __post_init__(self) -> None:
        if self.dp < 1 or self.fsdp < 1:
            raise ConfigError(f"hybrid.dp={self.dp}, hybrid.fsdp={self.fsdp}: both must be >= 1")

    @property
    def world(self) -> int:
        return self.dp * self.fsdp

    def coords(self, rank: int) -> tuple[int, int]:
        return divmod(rank, self.fsdp)

    def rank(self, replica: int, shard: int) -> int:
        return replica * self.fsdp + shard


@dataclass(frozen=True)
class GenerationLayout:
    """Tensor-parallel generation with `tp` ranks per engine replica."""

    tp: int = 1

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ConfigError(f"generation layout tp={self.tp}: must be >= 1")


def intersect(a: Box, b: Box) -> Box | None:
    box = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b, strict=True))
    return None if any(start >= stop for start, stop in box) else box


def box_numel(box: Box) -> int:
    return math.prod(stop - start for start, stop in box)


def contains(outer: Box, inner: Box) -> bool:
    return all(o0 <= i0 and i1 <= o1 for (o0, o1), (i0, i1) in zip(outer, inner, strict=True))


def canonical_name(name: str) -> str:
    """A parameter's name as the plain transformers model has it (PEFT and FSDP wrappers removed):
    `model.layers.0.self_attn.q_proj.weight`, `model.layers.0.self_attn.q_proj.lora_A.weight`."""
    for wrapper in ("base_model.model.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module."):
        name = name.replace(wrapper, "")
    return name.replace(".base_layer.", ".").replace(".default.", ".")


_COLUMN = {"gate_proj", "up_proj"}
_KV = {"k_proj", "v_proj"}
_Q = "q_proj"
_ROW = {"o_proj", "down_proj"}


def llama_specs(shapes: Mapping[str, Sequence[int]] | Iterable[tuple[str, Sequence[int]]], config: Any,
                itemsize: int = 4, aligned: bool = True) -> list[ParamSpec]:
    """The specs of a Llama's parameters (canonical names; LoRA tensors included) in the given order.

    `aligned=True` shards each parameter for training along the dimension generation splits it (the
    3D-HybridEngine's choice: a generation shard is then a union of training shards); False shards every
    parameter along dimension 0, FSDP2's default.
    """
    items = shapes.items() if isinstance(shapes, Mapping) else shapes
    query_heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or query_heads)
    specs = []
    for raw, shape in items:
        name = canonical_name(raw)
        parts = name.split(".")
        module = parts[-3] if parts[-2] in ("lora_A", "lora_B") else parts[-2]
        lora = parts[-2] if parts[-2] in ("lora_A", "lora_B") else None
        bias = parts[-1] == "bias"  # split like its layer's output rows: a row-parallel one replicated
        split: SplitKind = "replicated"
        heads = 0
        if module in ("embed_tokens", "lm_head"):
            split = "vocab"
        elif module in _COLUMN | _KV | {_Q}:
            if lora != "lora_A":
                split, heads = (("heads", kv_heads) if module in _KV else ("heads", query_heads)
                                if module == _Q else ("column", 0))
        elif module in _ROW and lora != "lora_B" and not bias:
            split = "row"
        train_dim = 1 if aligned and split == "row" else 0
        specs.append(ParamSpec(name, tuple(int(n) for n in shape), itemsize, train_dim, split, heads))
    return specs
