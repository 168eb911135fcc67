"""Reward per version from joined feedback: what the rollout analysis compares.

Each joined single answer (`TrainingSample` of kind `single` with a reward users actually gave; a
default reward for silence is not evidence) counts for the version that served it (its behaviour
version: a serving name such as `policy-v3`, or `base`). Statistics are kept per version in time
buckets, so the analysis can ask for "since this step began" and the rollout page can draw reward
over time with confidence bands, in bounded memory. Pure: the caller feeds samples from the bus.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from online_rl.events import TrainingSample
from online_rl.rollout.sequential import ArmStats

__all__ = ["RewardPoint", "RewardTally"]


@dataclass(frozen=True)
class RewardPoint:
    start: float  # the bucket's start (Unix seconds)
    mean: float
    lower: float  # pointwise 95 % band, for reading the chart (the decisions use `sequential`)
    upper: float
    n: int


class RewardTally:
    """Per-version reward statistics in `bucket_s` time buckets."""

    def __init__(self, bucket_s: float = 60.0) -> None:
        if bucket_s <= 0:
            raise ValueError(f"bucket_s={bucket_s} must be > 0, e.g. 60")
        self.bucket_s = bucket_s
        self._buckets: dict[str, dict[int, ArmStats]] = {}

    def add(self, sample: TrainingSample) -> bool:
        """Count `sample` for the version that served it; False if it is no evidence (a pair, a
        default reward, a reward outside 0-1)."""
        reward = sample.reward
        if sample.kind != "single" or sample.defaulted or reward is None or not 0 <= reward <= 1:
            return False
        version = (sample.behaviour_versions[0] if sample.behaviour_versions else None) or "base"
        index = int(sample.created_at // self.bucket_s)
        buckets = self._buckets.setdefault(version, {})
        buckets[index] = buckets.get(index, ArmStats()).add(float(reward))
        return True

    def versions(self) -> list[str]:
        return sorted(self._buckets)

    def stats(self, version: str, since: float = 0.0) -> ArmStats:
        """All rewards of `version` in the buckets from the one holding `since` on."""
        first = int(since // self.bucket_s)
        total = ArmStats()
        for index, stats in self._buckets.get(version, {}).items():
            if index >= first:
                total = total.merge(stats)
        return total

    def series(self, version: str) -> list[RewardPoint]:
        """Reward over time, one point per bucket that has any."""
        points = []
        for index, stats in sorted(self._buckets.get(version, {}).items()):
            half = 1.96 * math.sqrt(stats.variance / stats.n)
            points.append(RewardPoint(index * self.bucket_s, stats.mean, max(0.0, stats.mean - half),
                                      min(1.0, stats.mean + half), stats.n))
        return points
