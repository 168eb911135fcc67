"""Several LoRA adapters served beside one base model, chosen per batch row, swapped in microseconds.

Each targeted `nn.Linear` is wrapped once in `_LoraLinear`, which holds every resident adapter's
(A, B, scaling) and adds `scaling * x A^T B^T` to the rows routed to that adapter. Loading an adapter
is split in two: `prepare` reads and checks the PEFT folder (file IO and validation; any thread),
`install` puts the tensors in place (a few dict writes; the engine thread, between two steps). So a
hot swap pauses decoding for well under a millisecond, where PEFT's `load_adapter` walks the whole
module tree (about 0.2 s on the 135M model, during which nothing is generated).

The folder format is PEFT's (`adapter_config.json` + `adapter_model.safetensors`); variants this
module does not implement (DoRA, LoRA biases, embedding LoRA, `modules_to_save`, per-layer ranks)
are refused with the reason.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from online_rl.serving.errors import AdapterLoadError

__all__ = ["MultiLora", "PreparedAdapter"]

_PREFIX = "base_model.model."


@dataclass(frozen=True)
class PreparedAdapter:
    """An adapter read from disk, ready to install: module path -> (A, B) and its scaling."""

    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]
    scaling: float


class _LoraLinear(nn.Module):
    """A linear layer plus the LoRA deltas of the adapters routed to each row."""

    def __init__(self, base: nn.Linear, router: MultiLora) -> None:
        super().__init__()
        self.base = base
        self.router = router
        self.adapters: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x)
        for name, rows in self.router.routing:
            entry = self.adapters.get(name)
            if entry is None:  # the adapter does not touch this layer
                continue
            a, b, scaling = entry
            if rows is None:  # every row uses this adapter
                out = out + (x @ a.T @ b.T) * scaling
            else:
                out = out.index_add(0, rows, (x.index_select(0, rows) @ a.T @ b.T) * scaling)
        return out


class MultiLora:
    """The resident adapters of one model and the per-row routing of the next forward pass."""

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        self._wrapped: dict[str, _LoraLinear] = {}
        self._installed: dict[str, list[str]] = {}  # adapter -> module paths it touches
        self.routing: list[tuple[str, torch.Tensor | None]] = []

    @staticmethod
    def prepare(folder: Path) -> PreparedAdapter:
        """Read and check a PEFT LoRA folder (safe to call from any thread)."""
        from safetensors.torch import load_file

        try:
            config = json.loads((folder / "adapter_config.json").read_text())
            tensors = load_file(str(folder / "adapter_model.safetensors"), device="cpu")
        except (OSError, ValueError) as exc:
            raise AdapterLoadError(f"cannot read the adapter in {folder}: {exc}") from exc
        unsupported = [key for key in ("use_dora", "lora_bias", "modules_to_save", "rank_pattern",
                                       "alpha_pattern", "layer_replication") if config.get(key)]
        if config.get("peft_type", "LORA") != "LORA" or unsupported:
            raise AdapterLoadError(f"the adapter in {folder} uses {unsupported or config.get('peft_type')}, "
                                   "which serving does not implement; train a plain LoRA adapter")
        rank, alpha = int(config["r"]), float(config["lora_alpha"])
        scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for key, tensor in tensors.items():
            if not key.endswith(".lora_A.weight"):
                if not key.endswith(".lora_B.weight"):
                    raise AdapterLoadError(f"the adapter in {folder} holds {key}; only lora_A/lora_B "
                                           "weights of linear layers are served")
                continue
            path = key.removeprefix(_PREFIX).removesuffix(".lora_A.weight")
            b = tensors.get(key.replace(".lora_A.", ".lora_B."))
            if b is None or tensor.shape[0] != b.shape[1]:
                raise AdapterLoadError(f"the adapter in {folder} has no matching lora_B for {key}")
            weights[path] = (tensor.float().contiguous(), b.float().contiguous())
        if not weights:
            raise AdapterLoadError(f"the adapter in {folder} has no LoRA weights")
        return PreparedAdapter(weights, scaling)

    def install(self, name: str, adapter: PreparedAdapter) -> None:
        """Make `adapter` routable as `name` (the engine thread, between two forward passes)."""
        modules = dict(self._model.named_modules())
        for path, (a, b) in adapter.weights.items():
            layer = self._wrapped.get(path) or modules.get(path)
            if isinstance(layer, nn.Linear):
                layer = self._wrap(path, layer)
            if not isinstance(layer, _LoraLinear) or a.shape[1] != layer.base.in_features \
                    or b.shape[0] != layer.base.out_features:
                raise AdapterLoadError(f"the adapter's {path} does not fit this model (another base?)")
        for path, (a, b) in adapter.weights.items():
            layer = self._wrapped[path]
            dtype = layer.base.weight.dtype  # a bfloat16 base computes its deltas in bfloat16 too
            layer.adapters[name] = (a.to(dtype), b.to(dtype), adapter.scaling)
        self._installed[name] = list(adapter.weights)

    def remove(self, name: str) -> None:
        for path in self._installed.pop(name, []):
            self._wrapped[path].adapters.pop(name, None)

    def _wrap(self, path: str, layer: nn.Linear) -> _LoraLinear:
        parent_path, _, attr = path.rpartition(".")
        parent = self._model.get_submodule(parent_path) if parent_path else self._model
        wrapped = _LoraLinear(layer, self)
        setattr(parent, attr, wrapped)
        self._wrapped[path] = wrapped
        return wrapped

    @contextmanager
    def route(self, adapters: list[str | None]) -> Iterator[None]:
        """Route row i of the next forward pass to adapter `adapters[i]` (None: the base model)."""
        names = {name for name in adapters if name is not None}
        if len(names) == 1 and None not in adapters:
            self.routing = [(names.pop(), None)]
        else:
            self.routing = [(name, torch.tensor([i for i, a in enumerate(adapters) if a == name]))
                            for name in sorted(names)]
        try:
            yield
        finally:
            self.routing = []

    def names(self) -> list[str]:
        return list(self._installed)
