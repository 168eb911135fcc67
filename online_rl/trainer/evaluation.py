"""The trainer's held-out evaluation set: live samples kept out of training to judge the adapter.

A share of live samples (by a hash of the sample id, so restarts and workers agree) is never trained
on; the newest `size` of them are scored now and then by the policy worker (the mean beta-scaled
log-ratio margin against the reference, for the current adapter and the last published one). The
set travels in the checkpoint's metadata. Pure: no model, no bus, no MLflow.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from online_rl.trainer.samples import Pair, Routed, Thumb

__all__ = ["EvalSet", "eval_gain"]


class EvalSet:
    """The newest `size` held-out pairs and thumbs, oldest dropped first."""

    def __init__(self, size: int, entries: list[Any] | None = None) -> None:
        self.entries: deque[tuple[str, Pair | Thumb]] = deque(maxlen=size)
        for kind, sample in entries or []:
            self.entries.append((kind, tuple(sample)))

    def add(self, held: Routed) -> None:
        self.entries.extend(("pair", pair) for pair in held.pairs)
        self.entries.extend(("thumb", thumb) for thumb in held.thumbs)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def pairs(self) -> list[Pair]:
        return [sample for kind, sample in self.entries if kind == "pair"]  # type: ignore[misc]

    @property
    def thumbs(self) -> list[Thumb]:
        return [sample for kind, sample in self.entries if kind == "thumb"]  # type: ignore[misc]

    def to_metadata(self) -> list[Any]:
        return [[kind, list(sample)] for kind, sample in self.entries]


def eval_gain(result: dict[str, float]) -> float:
    """How much the current adapter beats the last published one on the held-out set (the reference
    itself scores 0, so with nothing published yet the gain is the score)."""
    return result["eval_score"] - result.get("eval_baseline_score", 0.0)
