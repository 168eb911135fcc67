"""The reward mapping: every feedback kind to [0, 1], versioned by its rules."""

from __future__ import annotations

import pytest

from online_rl.errors import ConfigError, UnmappedFeedback
from online_rl.events import Feedback
from online_rl.rewards import RewardMapping
from tests.factories import preference, rating, thumbs


def _event(**fields: object) -> Feedback:
    return Feedback(**{"event_id": "e", "request_id": "r", "user_id": "u", "created_at": 1.0, **fields})


def test_each_kind_maps_into_the_unit_interval() -> None:
    m = RewardMapping()
    assert m.reward(thumbs("r", up=True)) == 1.0
    assert m.reward(thumbs("r", up=False)) == 0.0
    assert m.reward(rating("r", 4.0)) == pytest.approx(0.75)
    assert m.reward(_event(kind="scalar", value=7.0)) == 1.0
    assert m.reward(_event(kind="implicit", signal="copied")) == 1.0
    assert m.reward(_event(kind="implicit", signal="dwell_time", value=30.0)) == pytest.approx(0.5)
    with pytest.raises(UnmappedFeedback, match="add it to implicit_constant"):
        m.reward(_event(kind="implicit", signal="blinked"))
    with pytest.raises(UnmappedFeedback, match="chosen/rejected pair"):
        m.reward(preference("r", "s"))


def test_version_changes_with_the_rules() -> None:
    assert RewardMapping().version == RewardMapping().version
    assert RewardMapping().version != RewardMapping(scalar_range=(-1.0, 1.0)).version
    assert RewardMapping().version.startswith("default-")


def test_bad_rules_say_how_to_fix() -> None:
    with pytest.raises(ConfigError, match="min < max"):
        RewardMapping(scalar_range=(1.0, 1.0))
    with pytest.raises(ConfigError, match="must lie in"):
        RewardMapping(implicit_constant={"copied": 2.0})
