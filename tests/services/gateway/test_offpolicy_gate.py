"""The off-policy gate on the real stack: before any user sees a challenger, its reward is estimated
from the champion's logged answers; a worse one is rolled back unseen, a better one goes ahead with
its measured KL to the champion in the audit log."""

from __future__ import annotations

import pytest

from tests.services.gateway.conftest import GOOD, StackFactory, Users

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_the_gate_stops_a_worse_challenger_before_exposure(make_stack: StackFactory) -> None:
    stack = make_stack(offpolicy_gate=True, offpolicy_min_samples=40, offpolicy_margin=0.1,
                       offpolicy_min_ess=5, min_samples=10_000)
    # The champion says GOOD in about half of its sampled answers: logged answers of both kinds.
    champion = stack.publish(GOOD, strength=1.6)
    stack.wait(lambda s: s["rollout"] is not None and s["rollout"]["status"] == "running")
    assert stack.api("POST", "/rollout/promote").status_code == 200
    users = Users(stack, 20, noise=0.0, temperature=1.0)
    try:
        for _ in range(4):
            users.round()
        stack.wait(lambda s: s["samples_seen"] >= 60, timeout=60)

        never = stack.publish(GOOD, strength=-2.0)  # never says it
        stack.wait(lambda s: s["rollout"]["challenger"] == never and s["rollout"]["status"] == "rolled_back")
        rejected = stack.api("GET", "/rollout/history").json()["entries"][-1]
        assert rejected["action"] == "reject" and rejected["weight"] == 0  # never running, never served
        assert rejected["reason"].startswith("off-policy gate: estimated reward")
        gate = rejected["evidence"]
        assert gate["offpolicy_value"] < 0.1 < gate["offpolicy_logged_value"] - 0.1, gate
        assert gate["offpolicy_ess"] >= 5 and gate["kl"] > 0
        after = users.round()
        assert f"policy-v{never}" not in {a.version for a in after}  # nobody ever saw it

        better = stack.publish(GOOD, strength=1.8)  # says it a little more often than the champion
        status = stack.wait(lambda s: s["rollout"]["challenger"] == better)
        assert status["rollout"]["status"] == "running" and status["champion"]["version"] == champion
        gate = stack.api("GET", "/rollout/history").json()["entries"][-1]["evidence"]
        assert gate["offpolicy"] == "passed", gate
        assert gate["offpolicy_value"] > gate["offpolicy_logged_value"], gate
    finally:
        users.close()
