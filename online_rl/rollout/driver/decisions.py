"""The MLflow side of the rollout's decisions (the state and its audit log are `rollout.state`).

One rollout at a time walks a challenger version through the plan. Every decision — the plan's
(`plan.decide`) or a person's (pause, resume, set weight, promote, roll back) — is applied to the
state, written durably (the state file is replaced atomically, the audit log is appended and
fsynced) and, when it promotes or rolls back, carried out in MLflow: promotion moves the `champion`
alias to the challenger and drops `challenger` (the old champion stays registered and loadable);
a rollback drops `challenger` and leaves `champion` where it was. Each version involved is tagged
with the decision and its evidence, so the MLflow UI tells the story too. The state survives a
restart of whatever runs the controller.

Knows MLflow's client and the plan; knows nothing about HTTP, the gateway or the inference replicas
(the gateway reads `weight` and loads or unloads adapters).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from online_rl.faults import failpoint
from online_rl.registry import alias_version
from online_rl.rollout.errors import RolloutConflict
from online_rl.rollout.plan import Decision, Evidence, RolloutPlan, decide
from online_rl.rollout.state import RolloutState, RolloutStore

if TYPE_CHECKING:
    from mlflow import MlflowClient

__all__ = ["RolloutController"]

logger = logging.getLogger(__name__)


class RolloutController:
    """Applies decisions to the one rollout in `store`, in MLflow and in the audit log."""

    def __init__(self, client: MlflowClient, registered_model: str, plan: RolloutPlan, store: RolloutStore,
                 clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.registered_model = registered_model
        self.plan = plan
        self.store = store
        self.clock = clock
        self.state = store.load()
        if self.state is not None:
            self._complete_audit(self.state)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, challenger: str | None = None, actor: str = "controller",
              evidence: dict[str, Any] | None = None) -> RolloutState:
        """Begin a rollout of `challenger` (default: the version the `challenger` alias names);
        `evidence` (e.g. the off-policy gate's estimate) goes into the audit entry."""
        if self.state is not None and self.state.active:
            raise RolloutConflict(f"rollout {self.state.rollout_id} of version {self.state.challenger} is "
                                  f"{self.state.status}: promote or roll it back first")
        version = challenger or alias_version(self.client, self.registered_model, "challenger")
        if version is None:
            raise RolloutConflict(f"MLflow has no `challenger` version of {self.registered_model!r} to "
                                  "roll out: publish one (the trainer does) or name the version")
        self.check_version(str(version))
        now = self.clock()
        self.state = RolloutState(
            rollout_id=f"r-{uuid.uuid4().hex[:12]}", registered_model=self.registered_model,
            challenger=str(version),
            champion=alias_version(self.client, self.registered_model, "champion"),
            weight=self.plan.steps[0], started=now, step_started=now)
        self._record("start", f"rollout of version {version} at {self.plan.steps[0]:.0%}", actor, evidence)
        return self.state

    def reject(self, version: str, reason: str, actor: str = "controller",
               evidence: dict[str, Any] | None = None) -> RolloutState:
        """Record a rollout of `version` that ended before any exposure (it could not be loaded, or
        the off-policy gate objected): never running, so no request is ever routed to it."""
        if self.state is not None and self.state.active:
            raise RolloutConflict(f"rollout {self.state.rollout_id} is {self.state.status}")
        now = self.clock()
        self.state = RolloutState(
            rollout_id=f"r-{uuid.uuid4().hex[:12]}", registered_model=self.registered_model,
            challenger=version,
            champion=alias_version(self.client, self.registered_model, "champion"), status="rolled_back",
            started=now, step_started=now, mlflow_pending="reject")
        self._record("reject", reason, actor, evidence)
        self.sync_mlflow()
        return self.state

    def check_version(self, version: str) -> None:
        """Refuse a version the registry does not have (RolloutConflict names it)."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_model_version(self.registered_model, version)
        except MlflowException as error:
            if error.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise RolloutConflict(f"MLflow has no version {version} of {self.registered_model!r}; "
                                      "name a registered version") from error
            raise

    def observe(self, evidence: Evidence) -> Decision | None:
        """Let the plan judge `evidence` (None while paused or without a rollout)."""
        state = self.state
        if state is None or state.status != "running":
            return None
        decision = decide(self.plan, state.step, state.step_started, self.clock(), evidence)
        if decision.action != "hold":
            self._apply(decision.action, decision.reason, "controller", decision)
        return decision

    # -- a person's controls ----------------------------------------------------------------------
    def pause(self, actor: str) -> RolloutState:
        state = self._require(("running",), "pause")
        state.status = "paused"
        self._record("pause", "paused: traffic split frozen", actor)
        return state

    def resume(self, actor: str) -> RolloutState:
        state = self._require(("paused",), "resume")
        state.status = "running"
        state.step_started = self.clock()  # the step's clock restarts: time paused is not evidence
        self._record("resume", "resumed", actor)
        return state

    def set_weight(self, weight: float, actor: str) -> RolloutState:
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"weight={weight} must lie in [0, 1], e.g. 0.1 for 10% to the challenger")
        state = self._require(("running", "paused"), "set the weight of")
        state.weight = weight
        self._record("set_weight", f"weight set to {weight:.0%} by hand", actor)
        return state

    def promote(self, actor: str, reason: str = "promoted by hand") -> RolloutState:
        self._require(("running", "paused"), "promote")
        return self._apply("promote", reason, actor)

    def rollback(self, actor: str, reason: str = "rolled back by hand") -> RolloutState:
        self._require(("running", "paused"), "roll back")
        return self._apply("rollback", reason, actor)

    # -- applying decisions -------------------------------------------------------------------------
    def _apply(self, action: str, reason: str, actor: str, decision: Decision | None = None) -> RolloutState:
        # The traffic moves first (the state is saved before anything else can fail); MLflow's
        # aliases and tags follow, retried by `sync_mlflow` while the registry is away.
        state = self.state
        assert state is not None
        evidence = _evidence(decision)
        if action == "advance":
            assert decision is not None
            state.step, state.weight, state.step_started = decision.step, decision.weight, self.clock()
        elif action == "promote":
            state.status, state.weight, state.mlflow_pending = "promoted", 1.0, "promote"
        elif action == "rollback":
            state.status, state.weight, state.mlflow_pending = "rolled_back", 0.0, "rollback"
        self._record(action, reason, actor, evidence)
        if state.mlflow_pending:
            self.sync_mlflow()
        return state

    def sync_mlflow(self) -> bool:
        """Carry out a pending promotion or rollback in MLflow; False (logged) if the registry failed."""
        state = self.state
        if state is None or state.mlflow_pending is None:
            return True
        entry: dict[str, Any] = next(
            (e for e in reversed(state.history) if e["action"] == state.mlflow_pending), {})
        reason, evidence = entry.get("reason", ""), entry.get("evidence") or {}
        try:
            if state.mlflow_pending == "promote":
                self._promote_in_mlflow(state, reason, evidence)
            else:
                self._rollback_in_mlflow(state, reason, evidence)
        except Exception as exc:
            logger.warning("rollout %s: MLflow did not take the %s yet (%s); retrying", state.rollout_id,
                           state.mlflow_pending, exc)
            return False
        state.mlflow_pending = None
        self.store.save(state)
        return True

    def _promote_in_mlflow(self, state: RolloutState, reason: str, evidence: dict[str, Any]) -> None:
        # Retried after a crash or an outage part way: every call below is idempotent, and the champion
        # replaced is the one the rollout began against when MLflow already names the challenger.
        name, version = state.registered_model, state.challenger
        previous = alias_version(self.client, name, "champion")
        if previous == version:
            previous = state.champion
        self.client.set_registered_model_alias(name, "champion", version)
        failpoint("rollout.mid_mlflow")
        if alias_version(self.client, name, "challenger") == version:
            self.client.delete_registered_model_alias(name, "challenger")
        self._tag(version, {"rollout.status": "promoted", "rollout.reason": reason,
                            "rollout.replaced": previous or ""} | _tags(evidence))
        if previous is not None and previous != version:
            self._tag(previous, {"rollout.superseded_by": version, "rollout.id": state.rollout_id})

    def _rollback_in_mlflow(self, state: RolloutState, reason: str, evidence: dict[str, Any]) -> None:
        name, version = state.registered_model, state.challenger
        if alias_version(self.client, name, "challenger") == version:
            self.client.delete_registered_model_alias(name, "challenger")
        if state.champion is not None and alias_version(self.client, name, "champion") != state.champion:
            self.client.set_registered_model_alias(name, "champion", state.champion)  # restore it
        self._tag(version, {"rollout.status": "rolled_back", "rollout.reason": reason} | _tags(evidence))

    def _tag(self, version: str, tags: dict[str, str]) -> None:
        # MLflow sets one tag per call: the verdict (`rollout.status`) goes last, so whoever sees it
        # also finds its reason and evidence.
        for key, value in sorted(tags.items(), key=lambda item: item[0] == "rollout.status"):
            self.client.set_model_version_tag(self.registered_model, version, key, value[:5000])

    def _record(self, action: str, reason: str, actor: str, evidence: dict[str, Any] | None = None) -> None:
        state = self.state
        assert state is not None
        entry = {"at": self.clock(), "rollout_id": state.rollout_id, "version": state.challenger,
                 "action": action, "reason": reason, "actor": actor, "status": state.status,
                 "step": state.step, "weight": state.weight, "evidence": evidence or {}}
        state.history.append(entry)
        self.store.save(state)  # the state first: a crash before the audit line repeats no decision
        failpoint("rollout.after_state_write")  # (and the restart writes the missing line: _complete_audit)
        self.store.audit(entry)
        logger.info("rollout %s: %s (%s) by %s", state.rollout_id, action, reason, actor,
                    extra={"event": "rollout", **{k: v for k, v in entry.items() if k != "evidence"}})

    def _complete_audit(self, state: RolloutState) -> None:
        """Append the decisions of `state` that a crash kept out of the audit log (saved to the state
        file, killed before the audit line): the log then tells every decision once."""
        logged = {(e.get("rollout_id"), e.get("action"), e.get("at")) for e in self.store.entries()
                  if e.get("rollout_id") == state.rollout_id}
        for entry in state.history:
            if (entry.get("rollout_id"), entry.get("action"), entry.get("at")) not in logged:
                self.store.audit(entry)
                logger.warning("rollout %s: the audit log lacked its %s (a crash after the state was "
                               "saved); written now", state.rollout_id, entry.get("action"))

    def _require(self, statuses: tuple[str, ...], verb: str) -> RolloutState:
        if self.state is None or self.state.status not in statuses:
            status = self.state.status if self.state else "no rollout"
            raise RolloutConflict(f"cannot {verb} a rollout that is {status}")
        return self.state


def _evidence(decision: Decision | None) -> dict[str, Any]:
    if decision is None:
        return {}
    c = decision.comparison
    return {"difference": c.difference, "lower": c.lower, "upper": c.upper, "p_value": c.p_value,
            "challenger_n": c.challenger_n, "champion_n": c.champion_n, "verdict": decision.verdict}


def _tags(evidence: dict[str, Any]) -> dict[str, str]:
    """MLflow tags of a decision's evidence; `rollout.verdict`: passed, worse, guardrail, inconclusive (no
    verdict within the step's limit), or manual (a person's decision)."""
    tags = {f"rollout.evidence.{key}": f"{value:.6g}" if isinstance(value, float) else str(value)
            for key, value in evidence.items() if value is not None and key != "verdict"}
    return tags | {"rollout.verdict": str(evidence.get("verdict", "manual"))}
