"""The rollout controller against a real MLflow store: promotion moves `champion`, a rollback drops
`challenger`, every decision is tagged and audited, and the state survives a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from online_rl.config import Settings
from online_rl.rollout import ArmStats, Evidence, RolloutConflict, RolloutPlan, RolloutStore
from online_rl.rollout.driver import RolloutController

PLAN = RolloutPlan(steps=(0.05, 0.5, 1.0), min_samples=100, max_step_s=600)


def _arm(n: int, mean: float) -> ArmStats:
    ones = round(n * mean)
    return ArmStats(n=n, total=float(ones), total_sq=float(ones))


GOOD = Evidence(_arm(2000, 0.65), _arm(2000, 0.5))
BAD = Evidence(_arm(1500, 0.3), _arm(2000, 0.5))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def client(local_settings: Settings, tmp_path: Path) -> Any:
    from online_rl.tracking import mlflow_client

    client = mlflow_client(local_settings)
    client.create_registered_model("policy")
    for version in ("1", "2", "3"):
        folder = tmp_path / f"adapter-{version}"
        folder.mkdir()
        assert str(client.create_model_version("policy", source=str(folder)).version) == version
    client.set_registered_model_alias("policy", "champion", "1")
    client.set_registered_model_alias("policy", "challenger", "2")
    return client


def test_a_good_challenger_walks_the_plan_to_promotion(client: Any, tmp_path: Path) -> None:
    clock, store = Clock(), RolloutStore(tmp_path / "rollout")
    controller = RolloutController(client, "policy", PLAN, store, clock)
    state = controller.start()
    assert (state.challenger, state.champion, state.weight) == ("2", "1", 0.05)
    assert controller.observe(Evidence(_arm(10, 0.7), _arm(200, 0.5))).action == "hold"  # type: ignore[union-attr]
    actions = [controller.observe(GOOD).action for _ in range(3)]  # type: ignore[union-attr]
    assert actions == ["advance", "advance", "promote"]
    assert str(client.get_model_version_by_alias("policy", "champion").version) == "2"
    with pytest.raises(Exception, match="challenger"):
        client.get_model_version_by_alias("policy", "challenger")
    tags = client.get_model_version("policy", "2").tags
    assert tags["rollout.status"] == "promoted" and tags["rollout.replaced"] == "1"
    assert float(tags["rollout.evidence.lower"]) > -0.02 and tags["rollout.verdict"] == "passed"
    assert client.get_model_version("policy", "1").tags["rollout.superseded_by"] == "2"  # still loadable
    assert [e["action"] for e in store.entries()] == ["start", "advance", "advance", "promote"]
    assert all(e["evidence"]["challenger_n"] == 2000 for e in store.entries()[1:])
    # a restarted controller finds the finished rollout, and may start the next one
    again = RolloutController(client, "policy", PLAN, store, clock)
    assert again.state is not None and again.state.status == "promoted" and again.state.weight == 1.0


def test_a_worse_challenger_is_rolled_back_and_the_champion_kept(client: Any, tmp_path: Path) -> None:
    clock, store = Clock(), RolloutStore(tmp_path / "rollout")
    controller = RolloutController(client, "policy", PLAN, store, clock)
    controller.start("2")
    decision = controller.observe(BAD)
    assert decision is not None and decision.action == "rollback" and "challenger worse" in decision.reason
    state = controller.state
    assert state is not None and (state.status, state.weight) == ("rolled_back", 0)
    assert str(client.get_model_version_by_alias("policy", "champion").version) == "1"
    with pytest.raises(Exception, match="challenger"):
        client.get_model_version_by_alias("policy", "challenger")
    tags = client.get_model_version("policy", "2").tags
    assert tags["rollout.status"] == "rolled_back" and "challenger worse" in tags["rollout.reason"]
    assert tags["rollout.verdict"] == "worse"  # on evidence, not for the lack of it


def test_people_pause_resume_and_decide_and_the_state_survives_a_restart(client: Any, tmp_path: Path) -> None:
    clock, store = Clock(), RolloutStore(tmp_path / "rollout")
    controller = RolloutController(client, "policy", PLAN, store, clock)
    controller.start()
    with pytest.raises(RolloutConflict, match="promote or roll it back first"):
        controller.start("3")
    controller.pause("api:alice")
    assert controller.observe(GOOD) is None  # paused: the plan does not act
    clock.now += 900  # longer than a step may last, but paused time is not evidence
    restarted = RolloutController(client, "policy", PLAN, store, clock)  # e.g. the gateway restarted
    assert restarted.state is not None and restarted.state.status == "paused"
    restarted.resume("api:alice")
    assert restarted.observe(Evidence(_arm(10, 0.5), _arm(10, 0.5))).action == "hold"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"weight=1.5 must lie in \[0, 1\]"):
        restarted.set_weight(1.5, "api:alice")
    restarted.set_weight(0.3, "api:alice")
    restarted.promote("api:bob", "looked good on the dashboard")
    assert str(client.get_model_version_by_alias("policy", "champion").version) == "2"
    with pytest.raises(RolloutConflict, match="cannot roll back a rollout that is promoted"):
        restarted.rollback("api:bob")
    entries = store.entries()
    assert [(e["action"], e["actor"]) for e in entries] == [
        ("start", "controller"), ("pause", "api:alice"), ("resume", "api:alice"),
        ("set_weight", "api:alice"), ("promote", "api:bob")]
    assert entries[-1]["reason"] == "looked good on the dashboard"


def test_a_rollback_moves_the_traffic_even_while_mlflow_is_away(
        client: Any, local_settings: Settings, tmp_path: Path) -> None:
    controller = RolloutController(client, "policy", PLAN, RolloutStore(tmp_path / "rollout"), Clock())
    controller.start()
    db = Path(local_settings.mlflow_tracking_uri.removeprefix("sqlite:///"))
    away = db.with_suffix(".away")
    db.rename(away)  # the registry is gone: SQLite opens an empty file in its place
    try:
        state = controller.rollback("key:ops", "bad answers reported")
        assert (state.status, state.weight, state.mlflow_pending) == ("rolled_back", 0.0, "rollback")
        assert RolloutStore(tmp_path / "rollout").load().status == "rolled_back"  # saved before MLflow
        assert controller.sync_mlflow() is False
    finally:
        db.unlink(missing_ok=True)
        away.rename(db)
    assert controller.sync_mlflow() is True  # the registry is back: the aliases follow
    assert controller.state is not None and controller.state.mlflow_pending is None
    assert client.get_registered_model("policy").aliases.get("challenger") is None
    assert client.get_model_version("policy", "2").tags["rollout.reason"] == "bad answers reported"


def test_a_rejected_version_is_never_running_and_an_unknown_one_is_refused(client: Any,
                                                                          tmp_path: Path) -> None:
    controller = RolloutController(client, "policy", PLAN, RolloutStore(tmp_path / "rollout"), Clock())
    with pytest.raises(RolloutConflict, match="MLflow has no version 9 of 'policy'"):
        controller.start("9")
    assert controller.state is None and controller.store.entries() == []
    state = controller.reject("2", "could not load: another base model")
    assert (state.status, state.weight) == ("rolled_back", 0.0)
    assert [e["action"] for e in controller.store.entries()] == ["reject"]
    assert client.get_model_version("policy", "2").tags["rollout.status"] == "rolled_back"
    aliases = client.get_registered_model("policy").aliases
    assert {k: str(v) for k, v in aliases.items()} == {"champion": "1"}


def test_a_promotion_cut_short_after_the_state_write_or_mid_mlflow_is_finished_once_on_restart(
        client: Any, tmp_path: Path) -> None:
    # What a SIGKILL leaves at `rollout.after_state_write` (bench/chaos.py kills a real gateway there):
    # the promotion saved to the state file, with neither its audit line nor MLflow written.
    clock, store = Clock(), RolloutStore(tmp_path / "rollout")
    controller = RolloutController(client, "policy", PLAN, store, clock)
    state = controller.start("2")
    clock.now += 5
    state.status, state.weight, state.mlflow_pending = "promoted", 1.0, "promote"
    state.history.append({"at": clock.now, "rollout_id": state.rollout_id, "version": "2",
                          "action": "promote", "reason": "promoted by hand", "actor": "alice",
                          "status": "promoted", "step": 0, "weight": 1.0, "evidence": {}})
    store.save(state)
    with store.audit_path.open("a") as audit:
        audit.write('{"torn": ')  # and a line torn by the crash
    # ... then at `rollout.mid_mlflow`: the next controller moved `champion` and died there
    client.set_registered_model_alias("policy", "champion", "2")

    again = RolloutController(client, "policy", PLAN, store, clock)
    assert [e["action"] for e in store.entries()] == ["start", "promote"]  # the missing line, once
    assert again.sync_mlflow() and again.state is not None and again.state.mlflow_pending is None
    assert str(client.get_model_version_by_alias("policy", "champion").version) == "2"
    with pytest.raises(Exception, match="challenger"):
        client.get_model_version_by_alias("policy", "challenger")
    tags = client.get_model_version("policy", "2").tags
    # the champion it replaced is the rollout's, not the alias it had already moved
    assert tags["rollout.status"] == "promoted" and tags["rollout.replaced"] == "1", tags
    assert client.get_model_version("policy", "1").tags["rollout.superseded_by"] == "2"
    RolloutController(client, "policy", PLAN, store, clock)  # a third start adds nothing
    assert [e["action"] for e in store.entries()] == ["start", "promote"]
