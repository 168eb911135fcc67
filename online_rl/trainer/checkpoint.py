"""Durable trainer checkpoints: the adapter, the optimizer, the random state and the bus offsets.

A checkpoint is what makes the trainer's effect exactly-once: it holds the offsets of the first
records *not* yet trained on, next to the weights that have seen everything before them. The trainer
commits offsets to the bus only after `CheckpointStore.save` returned, and on restart seeks to the
offsets of the checkpoint it restored (not to the bus's committed ones), so a record is neither lost
nor trained twice even when the newest checkpoint turns out to be unreadable.

Layout of `root/step-000000123/`: `tensors.safetensors` (adapter, optimizer tensors, torch RNG),
`state.json` (step, counters, offsets, optimizer hyper-parameters, Python/NumPy RNG, extra metadata)
and `manifest.json` (sha256 of both). A checkpoint is written into a temporary folder, synced and
renamed into place; `latest` names the newest complete one. No pickle anywhere.

Knows nothing about Ray, MLflow or the bus client: offsets are plain (topic, partition) -> int.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from online_rl.bus import TopicPartition
from online_rl.faults import failpoint
from online_rl.registry.lineage import file_sha256
from online_rl.trainer.errors import CheckpointCorrupt

__all__ = ["Checkpoint", "CheckpointStore", "capture_rng", "restore_rng"]

logger = logging.getLogger(__name__)
_TENSORS, _STATE, _MANIFEST, _LATEST = "tensors.safetensors", "state.json", "manifest.json", "latest"


@dataclass
class Checkpoint:
    """Everything needed to resume training exactly where it stopped."""

    step: int
    samples: int  # samples trained on so far
    offsets: dict[TopicPartition, int]  # next offset to read, per partition
    adapter: dict[str, torch.Tensor]  # trainable parameters by name
    optimizer: dict[str, Any]  # torch optimizer state_dict
    rng: dict[str, Any] = field(default_factory=dict)  # capture_rng()
    metadata: dict[str, Any] = field(default_factory=dict)  # JSON-able extras (config hash, versions, ...)
    critic: dict[str, Any] | None = None  # PPO's value model: {"adapter": tensors, "optimizer": state_dict}

    def restore_into(self, parameters: Mapping[str, torch.Tensor], optimizer: torch.optim.Optimizer) -> None:
        """Copy the adapter into `parameters` (by name), load the optimizer's state, restore the RNGs."""
        missing, unexpected = set(parameters) - set(self.adapter), set(self.adapter) - set(parameters)
        if missing or unexpected:
            raise CheckpointCorrupt(f"checkpoint of step {self.step} does not fit this adapter: missing "
                                    f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]} (was the "
                                    "LoRA rank or target list changed? start a new checkpoint folder)")
        with torch.no_grad():
            for name, parameter in parameters.items():
                parameter.copy_(self.adapter[name])
        optimizer.load_state_dict(self.optimizer)
        restore_rng(self.rng)


def capture_rng() -> dict[str, Any]:
    """The state of torch's, Python's and NumPy's global random generators."""
    version, state, gauss = random.getstate()
    name, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "torch": torch.get_rng_state(),
        "python": [version, list(state), gauss],
        "numpy": [name, np.asarray(keys).tolist(), int(position), int(has_gauss), float(cached)],
    }


def restore_rng(rng: Mapping[str, Any]) -> None:
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    if "python" in rng:
        version, state, gauss = rng["python"]
        random.setstate((version, tuple(state), gauss))
    if "numpy" in rng:
        name, keys, position, has_gauss, cached = rng["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), position, has_gauss, cached))


def _split_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Optimizer tensors (for safetensors) and the rest (for JSON)."""
    tensors: dict[str, torch.Tensor] = {}
    plain: dict[str, dict[str, Any]] = {}
    for index, values in state["state"].items():
        plain[str(index)] = {}
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer/{index}/{name}"] = value.detach().contiguous()
            else:
                plain[str(index)][name] = value
    return tensors, {"param_groups": state["param_groups"], "state": plain}


def _join_optimizer(tensors: Mapping[str, torch.Tensor], plain: Mapping[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {int(i): dict(values) for i, values in plain["state"].items()}
    for key, value in tensors.items():
        _, index, name = key.split("/", 2)
        state.setdefault(int(index), {})[name] = value
    return {"state": state, "param_groups": plain["param_groups"]}


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointStore:
    """Checkpoints under `root`, newest `keep` kept."""

    def __init__(self, root: Path, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1: at least the newest checkpoint is needed to resume")
        self.root = Path(root)
        self.keep = keep
        self.root.mkdir(parents=True, exist_ok=True)

    def save(self, checkpoint: Checkpoint) -> Path:
        """Write `checkpoint` durably; when this returns, its offsets may be committed to the bus."""
        name = f"step-{checkpoint.step:09d}"
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=self.root))
        try:
            optimizer_tensors, optimizer_plain = _split_optimizer(checkpoint.optimizer)
            tensors = {f"adapter/{k}": v.detach().cpu().contiguous() for k, v in checkpoint.adapter.items()}
            tensors.update({k: v.cpu() for k, v in optimizer_tensors.items()})
            rng = dict(checkpoint.rng)
            if "torch" in rng:
                tensors["rng/torch"] = rng.pop("torch")
            critic_plain = None
            if checkpoint.critic is not None:
                critic_tensors, critic_plain = _split_optimizer(checkpoint.critic["optimizer"])
                tensors.update({f"critic/{k}": v.cpu() for k, v in critic_tensors.items()})
                tensors.update({f"critic/adapter/{k}": v.detach().cpu().contiguous()
                                for k, v in checkpoint.critic["adapter"].items()})
            save_file(tensors, staging / _TENSORS)
            state = {
                "step": checkpoint.step,
                "samples": checkpoint.samples,
                "offsets": [[tp.topic, tp.partition, o] for tp, o in sorted(checkpoint.offsets.items())],
                "optimizer": optimizer_plain,
                "rng": rng,
                "metadata": checkpoint.metadata,
                "critic_optimizer": critic_plain,
            }
            (staging / _STATE).write_text(json.dumps(state))
            failpoint("checkpoint.mid_write")
            manifest = {f: file_sha256(staging / f) for f in (_TENSORS, _STATE)}
            (staging / _MANIFEST).write_text(json.dumps(manifest))
            for file in (_TENSORS, _STATE, _MANIFEST):
                _fsync(staging / file)
            _fsync(staging)
            final = self.root / name
            if final.exists():  # the same step again (nothing trained since): keep it until replaced
                previous = self.root / f".{name}-replaced"
                shutil.rmtree(previous, ignore_errors=True)
                os.replace(final, previous)
                os.replace(staging, final)
                shutil.rmtree(previous, ignore_errors=True)
            else:
                os.replace(staging, final)
            self._point_latest(name)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self._prune()
        logger.info("checkpoint %s written (%d samples, offsets %s)", name, checkpoint.samples,
                    {f"{tp.topic}/{tp.partition}": o for tp, o in checkpoint.offsets.items()})
        return final

    def _point_latest(self, name: str) -> None:
        pointer = self.root / f".{_LATEST}.tmp"
        pointer.write_text(name)
        _fsync(pointer)
        os.replace(pointer, self.root / _LATEST)
        _fsync(self.root)

    def _prune(self) -> None:
        for old in self.complete()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def complete(self) -> list[Path]:
        """Checkpoint folders that finished writing, oldest first."""
        for previous in self.root.glob(".step-*-replaced"):  # a crash while replacing the same step
            final = self.root / previous.name[1:].removesuffix("-replaced")
            if not final.exists() and (previous / _MANIFEST).is_file():
                os.replace(previous, final)
        return sorted(p for p in self.root.glob("step-*") if (p / _MANIFEST).is_file())

    def load(self, folder: Path) -> Checkpoint:
        """Read one checkpoint, verifying its files against the manifest."""
        try:
            manifest = json.loads((folder / _MANIFEST).read_text())
            for file, digest in manifest.items():
                if file_sha256(folder / file) != digest:
                    raise CheckpointCorrupt(f"{folder / file} does not match its manifest (sha256 differs)")
            state = json.loads((folder / _STATE).read_text())
            tensors = load_file(folder / _TENSORS)
        except (OSError, ValueError, KeyError) as error:
            raise CheckpointCorrupt(f"{folder} cannot be read: {error}") from error
        rng = dict(state["rng"])
        if "rng/torch" in tensors:
            rng["torch"] = tensors["rng/torch"]
        critic = None
        if state.get("critic_optimizer") is not None:
            critic = {
                "adapter": {k.removeprefix("critic/adapter/"): v for k, v in tensors.items()
                            if k.startswith("critic/adapter/")},
                "optimizer": _join_optimizer({k.removeprefix("critic/"): v for k, v in tensors.items()
                                              if k.startswith("critic/optimizer/")},
                                             state["critic_optimizer"]),
            }
        return Checkpoint(
            step=state["step"],
            samples=state["samples"],
            offsets={TopicPartition(topic, partition): o for topic, partition, o in state["offsets"]},
            adapter={k.removeprefix("adapter/"): v for k, v in tensors.items() if k.startswith("adapter/")},
            optimizer=_join_optimizer({k: v for k, v in tensors.items() if k.startswith("optimizer/")},
                                      state["optimizer"]),
            rng=rng,
            metadata=state["metadata"],
            critic=critic,
        )

    def load_latest(self) -> Checkpoint | None:
        """The newest readable checkpoint (falling back past corrupt ones), or None if there is none."""
        for folder in reversed(self.complete()):
            try:
                return self.load(folder)
            except CheckpointCorrupt as error:
                logger.error("skipping checkpoint %s: %s", folder.name, error)
        return None
