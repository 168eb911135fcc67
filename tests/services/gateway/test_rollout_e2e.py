"""A whole rollout through the real stack: a better challenger walks the plan to promotion, a worse
one is rolled back automatically; no client request fails and every user stays on one version per
step (Kafka, MLflow, two inference replicas, the joiner and the gateway, all real)."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import pytest

from online_rl.registry import alias_version
from online_rl.rollout import arm_for
from online_rl.tracking import mlflow_client
from tests.conftest import TINY_NAME
from tests.services.gateway.conftest import GOOD, Answer, Stack, StackFactory, Users

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _drive(stack: Stack, users: Users, rounds: int = 60) -> tuple[list[Answer], list[Answer], dict[str, Any]]:
    """Rounds of traffic until the rollout ends: every answer, those of the rounds that ended with
    the rollout still running, and the final status. Checks stickiness in every round the weight held."""
    answers: list[Answer] = []
    running: list[Answer] = []
    for _ in range(rounds):
        before = stack.status()["rollout"]
        batch = users.round()
        after = stack.status()["rollout"]
        answers += batch
        if after["status"] == "running":
            running += batch
        if before["status"] == after["status"] == "running" and before["weight"] == after["weight"]:
            for answer in batch:  # the split held still: each user got exactly its bucket's arm
                assert answer.arm == arm_for(after["rollout_id"], answer.user, after["weight"]), answer
        if after["status"] != "running":  # and once MLflow has taken the verdict (aliases, then tags)
            return answers, running, stack.wait(lambda s: s["rollout"]["mlflow_pending"] is None)
    raise AssertionError(f"the rollout did not end: {stack.status()}")


def _reasons(stack: Stack) -> list[tuple[str, str]]:
    return [(e["action"], e["reason"]) for e in stack.api("GET", "/rollout/history").json()["entries"]]


def _never_back(answers: list[Answer], challenger: str) -> None:
    """Weights only grow (and promotion gives everyone the challenger), so a user who reached the
    challenger's version is never served the champion's again."""
    versions: dict[str, list[str | None]] = defaultdict(list)
    for answer in answers:
        versions[answer.user].append(answer.version)
    for user, seen in versions.items():
        if challenger in seen:
            assert set(seen[seen.index(challenger):]) == {challenger}, (user, seen)


def test_a_better_challenger_is_promoted_and_a_worse_one_rolled_back(make_stack: StackFactory) -> None:
    # Small evidence thresholds for a short test; the in-process replicas' latency is noisy (a p99
    # of a few dozen answers is their maximum), hence the looser latency guardrail.
    stack = make_stack(steps=[0.2, 0.5, 1.0], min_samples=10, margin=0.05, max_step_s=300,
                       guardrail_min_requests=60, max_p99_latency_ratio=3.0)
    users = Users(stack, 40)
    client = mlflow_client(stack.settings)
    try:
        assert {a.version for a in users.round()} == {TINY_NAME}  # no version yet: the base serves

        # 1. A better challenger: loaded into both replicas, then 20% -> 50% -> 100% -> promoted.
        good = stack.publish(GOOD)
        good_name = f"policy-v{good}"
        started = stack.wait(lambda s: s["rollout"] is not None and s["rollout"]["challenger"] == good)
        assert started["rollout"]["weight"] == 0.2
        assert all(good_name in stack.replica_adapters(url) for url in stack.replicas)
        answers, running, status = _drive(stack, users)
        assert status["rollout"]["status"] == "promoted", _reasons(stack)
        assert [a.status for a in answers] == [200] * len(answers)  # zero failed client requests
        _never_back(answers, good_name)
        on_challenger = [a for a in answers if a.arm == "challenger"]
        assert on_challenger and all(a.version == good_name and GOOD in a.text for a in on_challenger)
        actions = [e["action"] for e in stack.api("GET", "/rollout/history").json()["entries"]]
        assert actions == ["start", "advance", "advance", "promote"], actions
        assert alias_version(client, "policy", "champion") == good
        assert alias_version(client, "policy", "challenger") is None
        tags = client.get_model_version("policy", good).tags
        assert tags["rollout.status"] == "promoted" and float(tags["rollout.evidence.lower"]) > -0.05
        assert {a.version for a in users.round()} == {good_name}  # everyone on the new champion

        # 2. A worse challenger (it says " no"): rolled back by the plan at its first step.
        bad = stack.publish(" no")
        bad_name = f"policy-v{bad}"
        stack.wait(lambda s: s["rollout"]["challenger"] == bad and s["rollout"]["status"] == "running")
        answers, running, status = _drive(stack, users)
        assert status["rollout"]["status"] == "rolled_back", _reasons(stack)
        assert [a.status for a in answers] == [200] * len(answers)
        _never_back(running, bad_name)  # (after the rollback everyone is back on the champion)
        last = stack.api("GET", "/rollout/history").json()["entries"][-1]
        assert last["action"] == "rollback" and last["actor"] == "controller"
        assert last["reason"].startswith("challenger worse") and last["evidence"]["upper"] < 0
        assert alias_version(client, "policy", "champion") == good  # the champion stayed
        assert alias_version(client, "policy", "challenger") is None
        assert client.get_model_version("policy", bad).tags["rollout.status"] == "rolled_back"
        deadline = time.monotonic() + 30
        while any(bad_name in stack.replica_adapters(url) for url in stack.replicas):
            assert time.monotonic() < deadline, "the rolled-back adapter was not unloaded"
            time.sleep(0.2)
        assert all(good_name in stack.replica_adapters(url) for url in stack.replicas)
        after = users.round()
        assert {a.version for a in after} == {good_name} and {a.status for a in after} == {200}
    finally:
        users.close()
