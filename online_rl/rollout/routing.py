"""Which serving name answers a request: the gateway's one decision per request.

From the rollout state (or none), the user and an optional override header: during an active
rollout the user's sticky bucket picks champion or challenger by the current weight; after a
promotion everyone gets the new champion, after a rollback the old one; a tester can force an arm
(`champion`, `challenger`) or an exact serving name that the rollout knows; users in the holdout
(`holdout` > 0) get the base model whatever the rollout does. Pure: the gateway turns
the answer into the upstream request's `model` and names it in the response.
"""

from __future__ import annotations

from dataclasses import dataclass

from online_rl.registry import serving_name
from online_rl.rollout.split import Arm, arm_for, in_holdout
from online_rl.rollout.state import RolloutState

__all__ = ["Route", "route_request"]


@dataclass(frozen=True)
class Route:
    arm: Arm
    model: str  # the serving name to ask the inference replica for
    forced: bool  # chosen by the override header, not by the split


def route_request(state: RolloutState | None, base_model: str, user_id: str,
                  override: str | None = None, current_champion: str | None = None,
                  holdout: float = 0.0) -> Route:
    """The route for one request (`base_model` serves when no version is champion yet).

    `current_champion`: the serving name MLflow's `champion` alias names now; outside a rollout it
    wins over what the last rollout left (an operator may have moved the alias since). `holdout`: the
    share of users the base model serves throughout; an override still forces a tester's arm."""
    if not override and in_holdout(user_id, holdout):
        return Route("holdout", base_model, False)
    if state is None or (not state.active and current_champion is not None):
        champion_now = current_champion or base_model
        if override and override not in ("champion", champion_now):
            raise ValueError(f"X-ORL-Version={override!r}: no rollout is running, only 'champion' "
                             f"({champion_now!r}) serves")
        return Route("champion", champion_now, bool(override))
    name = state.registered_model
    champion = serving_name(name, state.champion) if state.champion is not None else base_model
    challenger = serving_name(name, state.challenger)
    if state.status == "promoted":
        champion = challenger
    names: dict[str, Arm] = {champion: "champion", challenger: "challenger"}
    if override:
        if override in ("champion", "challenger"):
            arm: Arm = "champion" if override == "champion" else "challenger"
            return Route(arm, champion if arm == "champion" else challenger, True)
        if override not in names:
            raise ValueError(f"X-ORL-Version={override!r} is neither champion, challenger, {champion!r} "
                             f"nor {challenger!r}")
        return Route(names[override], override, True)
    if not state.active:
        return Route("champion", champion, False)
    arm = arm_for(state.rollout_id, user_id, state.weight)
    return Route(arm, challenger if arm == "challenger" else champion, False)
