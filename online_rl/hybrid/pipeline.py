"""The asynchronous rollout pipeline's bookkeeping: which batches are sampled ahead, how stale each one
is when it trains, and what happens to one older than the bound.

A batch is sampled by the adapter version current when it was submitted (`version`: the number of
policy updates so far) and trained when its turn comes; its staleness is the number of updates in
between. With `ahead` batches sampled beyond the one in training, every batch trains `ahead` updates
after the version that sampled it (fewer when a step trained nothing). `stale` says what happens past
`bound`:

- `wait`: no more than `bound` batches are sampled ahead, so none ever exceeds it (the engine idles
  instead);
- `drop`: `ahead` batches are sampled; one older than the bound is discarded when its turn comes and
  counted, and the pipeline refills with the newest adapter;
- `keep`: it trains anyway; its behaviour log-probs correct the update (decoupled PPO's importance
  weights, capped).

Each batch keeps the adapter name that sampled it, so lineage and the behaviour log-probs stay exact.
Pure logic: the engine calls are passed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Batch", "StalenessPipeline"]


@dataclass
class Batch:
    """A rollout batch in flight: the engine's handle, what sampled it and when it was submitted."""

    handle: Any
    adapter: str | None
    version: int
    payload: Any = None
    submitted: float = 0.0
    result: Any = field(default=None, repr=False)


class StalenessPipeline:
    """Batches sampled ahead of the update, within a staleness bound."""

    def __init__(self, bound: int, ahead: int | None = None,
                 stale: Literal["wait", "drop", "keep"] = "wait") -> None:
        if bound < 0 or (ahead is not None and ahead < 0):
            raise ValueError("max_staleness and rollout_ahead are >= 0")
        self.bound, self.stale = bound, stale
        self.ahead = bound if ahead is None else ahead
        self.inflight: deque[Batch] = deque()
        self.dropped = 0
        self.histogram: dict[int, int] = {}

    @property
    def depth(self) -> int:
        """Batches in flight while one trains, plus that one."""
        ahead = min(self.ahead, self.bound) if self.stale == "wait" else self.ahead
        return ahead + 1

    def next(self, version: int, submit: Callable[[int], Batch], collect: Callable[[Batch], Any],
             discard: Callable[[Batch], None] | None = None) -> tuple[Batch, int, list[Batch]]:
        """The batch to train at policy `version`, its staleness and the batches dropped on the way.
        `submit(version)` starts sampling a batch with the current adapter; `collect(batch)` waits for
        its result (stored on the batch); `discard(batch)` releases a dropped one."""
        dropped: list[Batch] = []
        while True:
            while len(self.inflight) < self.depth:
                self.inflight.append(submit(version))
            batch = self.inflight.popleft()
            batch.result = collect(batch)
            staleness = version - batch.version
            if staleness > self.bound and self.stale == "drop":
                dropped.append(batch)
                self.dropped += 1
                if discard is not None:
                    discard(batch)
                continue
            self.histogram[staleness] = self.histogram.get(staleness, 0) + 1
            return batch, staleness, dropped

    def drain(self) -> list[Batch]:
        """The batches still in flight (to release at the end)."""
        out, self.inflight = list(self.inflight), deque()
        return out
