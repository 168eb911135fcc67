"""Canary rollouts judged on users' feedback: sticky traffic splits, an always-valid sequential
comparison of the versions' rewards, guardrails, the off-policy gate's estimate, the plan's
decisions, the rollout's durable state and what it needs of the replicas (a protocol).

The modules of this package are pure: no HTTP client, no registry, no bus. `online_rl.rollout.driver`
runs them against MLflow, the bus and the replicas; the gateway service builds the driver.
"""

from online_rl.rollout.offpolicy import OffPolicyEstimate, snips
from online_rl.rollout.plan import ArmHealth, Decision, Evidence, Guardrails, RolloutPlan, decide
from online_rl.rollout.replicas import AdapterLoadFailed, Replica, Replicas, ReplicaUnavailable
from online_rl.rollout.rewards import RewardPoint, RewardTally
from online_rl.rollout.routing import Route, route_request
from online_rl.rollout.sequential import ArmStats, Comparison, compare
from online_rl.rollout.split import BUCKETS, Arm, arm_for, bucket
from online_rl.rollout.state import RolloutConflict, RolloutState, RolloutStore

__all__ = [
    "BUCKETS",
    "AdapterLoadFailed",
    "Arm",
    "ArmHealth",
    "ArmStats",
    "Comparison",
    "Decision",
    "Evidence",
    "Guardrails",
    "OffPolicyEstimate",
    "Replica",
    "ReplicaUnavailable",
    "Replicas",
    "RewardPoint",
    "RewardTally",
    "RolloutConflict",
    "RolloutPlan",
    "RolloutState",
    "RolloutStore",
    "Route",
    "arm_for",
    "bucket",
    "compare",
    "decide",
    "route_request",
    "snips",
]
