"""Canary rollouts judged on users' feedback: sticky traffic splits, an always-valid sequential
comparison of the versions' rewards, guardrails, the off-policy gate's estimate, the plan's
decisions, the rollout's durable state and what it needs of the replicas (a protocol).

The modules of this package are pure: no HTTP client, no registry, no bus. `online_rl.rollout.driver`
runs them against MLflow, the bus and the replicas; the gateway service builds the driver.
"""

from online_rl.rollout.errors import ReplicaRefusedVersion, ReplicaUnavailable, RolloutConflict
from online_rl.rollout.offpolicy import OffPolicyEstimate, snips
from online_rl.rollout.plan import ArmHealth, Decision, Evidence, Guardrails, RolloutPlan, decide
from online_rl.rollout.replicas import Replica, Replicas
from online_rl.rollout.rewards import RewardPoint, RewardTally
from online_rl.rollout.routing import Route, route_request
from online_rl.rollout.sequential import ArmStats, Comparison, compare
from online_rl.rollout.split import BUCKETS, Arm, arm_for, bucket
from online_rl.rollout.state import RolloutState, RolloutStore

__all__ = [
    "BUCKETS",
    "Arm",
    "ArmHealth",
    "ArmStats",
    "Comparison",
    "Decision",
    "Evidence",
    "Guardrails",
    "OffPolicyEstimate",
    "Replica",
    "ReplicaRefusedVersion",
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
