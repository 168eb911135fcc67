"""Sticky splits: a user stays on one version while a rollout advances."""

from __future__ import annotations

import pytest

from online_rl.rollout import arm_for


def test_raising_the_weight_only_moves_users_to_the_challenger() -> None:
    users = [f"user-{i}" for i in range(4000)]
    previous: set[str] = set()
    for weight in (0.05, 0.25, 0.5, 1.0):
        challenger = {u for u in users if arm_for("rollout-7", u, weight) == "challenger"}
        assert previous <= challenger  # nobody flips back to the champion
        assert abs(len(challenger) / len(users) - weight) < 0.03
        previous = challenger
    assert all(arm_for("rollout-7", u, 0.0) == "champion" for u in users)
    # the same user gets the same answer every time
    assert {arm_for("rollout-7", "user-1", 0.25) for _ in range(10)} == {arm_for("rollout-7", "user-1", 0.25)}


def test_a_new_rollout_reshuffles_who_goes_first() -> None:
    users = [f"user-{i}" for i in range(4000)]
    first = {u for u in users if arm_for("rollout-1", u, 0.1) == "challenger"}
    second = {u for u in users if arm_for("rollout-2", u, 0.1) == "challenger"}
    assert len(first & second) / len(first) < 0.2  # independent draws overlap by about 10 %


def test_a_weight_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError, match=r"challenger weight 1.5 must lie in \[0, 1\]"):
        arm_for("r", "u", 1.5)
