"""The gateway's per-request choice of version."""

from __future__ import annotations

import pytest

from online_rl.rollout import RolloutState, route_request


def _state(status: str = "running", weight: float = 0.25, champion: str | None = "1") -> RolloutState:
    return RolloutState(rollout_id="r-1", registered_model="policy", challenger="2", champion=champion,
                        status=status, weight=weight)  # type: ignore[arg-type]


def test_users_split_by_weight_and_stay_put() -> None:
    routes = {f"u{i}": route_request(_state(), "base", f"u{i}") for i in range(2000)}
    on_challenger = [u for u, r in routes.items() if r.model == "policy-v2"]
    assert 0.22 < len(on_challenger) / len(routes) < 0.28
    assert {r.model for r in routes.values()} == {"policy-v1", "policy-v2"}
    assert all(route_request(_state(weight=0.5), "base", u).model == "policy-v2" for u in on_challenger)


def test_after_the_rollout_everyone_gets_the_champion() -> None:
    assert route_request(_state("promoted"), "base", "u1").model == "policy-v2"
    assert route_request(_state("rolled_back"), "base", "u1").model == "policy-v1"
    assert route_request(_state(champion=None, weight=0.0), "base", "u1").model == "base"  # no champion yet
    assert route_request(None, "base", "u1").model == "base"


def test_testers_can_force_a_version() -> None:
    forced = route_request(_state(weight=0.0), "base", "u1", override="challenger")
    assert (forced.arm, forced.model, forced.forced) == ("challenger", "policy-v2", True)
    assert route_request(_state(weight=1.0), "base", "u1", override="policy-v1").arm == "champion"
    with pytest.raises(ValueError, match="X-ORL-Version='policy-v7' is neither champion, challenger"):
        route_request(_state(), "base", "u1", override="policy-v7")


def test_holdout_users_get_the_base_model_through_every_rollout() -> None:
    users = [f"u{i}" for i in range(4000)]
    held = {u for u in users if route_request(_state(), "base", u, holdout=0.1).arm == "holdout"}
    assert 0.08 < len(held) / len(users) < 0.12
    for state in (_state(), _state(weight=1.0), _state("promoted"), _state("rolled_back"), None):
        for user in held:  # the same users, whatever the rollout does, and nobody else
            assert route_request(state, "base", user, holdout=0.1).model == "base"
        others = [route_request(state, "base", u, holdout=0.1) for u in users[:300] if u not in held]
        assert all(r.arm != "holdout" for r in others)
    # a tester in the holdout can still force an arm; without a holdout nobody is held out
    user = next(iter(held))
    assert route_request(_state(), "base", user, override="challenger", holdout=0.1).model == "policy-v2"
    assert route_request(_state(), "base", user).arm != "holdout"
