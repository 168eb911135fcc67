"""Reward per version from joined samples: what counts as evidence, windows, and the chart's series."""

from __future__ import annotations

import random

import pytest

from online_rl.events import TrainingSample
from online_rl.rollout import RewardTally
from tests.trainer.test_samples import _thumb
from tests.trainer.test_trainer import _pair


def _rated(i: int, version: str | None, reward: float, at: float, defaulted: bool = False) -> TrainingSample:
    fields = _thumb(i, reward >= 0.5).model_dump()
    return TrainingSample.model_validate(fields | {"reward": reward, "behaviour_versions": [version],
                                                   "created_at": at, "defaulted": defaulted})


def test_rewards_count_for_the_version_that_served_them() -> None:
    tally = RewardTally(bucket_s=60)
    assert tally.add(_rated(1, "policy-v2", 1.0, 10))
    assert tally.add(_rated(2, "policy-v2", 0.0, 70))
    assert tally.add(_rated(3, None, 1.0, 15))  # the base model
    assert not tally.add(_rated(4, "policy-v2", 0.5, 20, defaulted=True))  # silence is no evidence
    assert not tally.add(_pair(5, random.Random(5)))  # a preference pair has no per-version reward
    assert tally.versions() == ["base", "policy-v2"]
    assert tally.stats("policy-v2").n == 2 and tally.stats("policy-v2").mean == pytest.approx(0.5)
    assert tally.stats("policy-v2", since=65).n == 1  # the step began in the second minute
    assert tally.stats("policy-v9").n == 0


def test_the_series_has_a_point_per_minute_with_a_band() -> None:
    tally = RewardTally(bucket_s=60)
    rng = random.Random(0)
    for i in range(400):
        tally.add(_rated(i, "policy-v3", float(rng.random() < 0.7), at=i * 0.5))
    points = tally.series("policy-v3")
    assert [p.start for p in points] == [0.0, 60.0, 120.0, 180.0]
    assert all(p.n == 120 or p.n == 40 for p in points)
    for point in points:
        assert point.lower < point.mean < point.upper and 0.5 < point.mean < 0.9
    with pytest.raises(ValueError, match="bucket_s=0 must be > 0"):
        RewardTally(bucket_s=0)
