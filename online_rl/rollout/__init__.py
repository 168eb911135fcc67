"""Canary rollouts judged on users' feedback: sticky traffic splits, an always-valid sequential
comparison of the versions' rewards, guardrails, the off-policy gate and the plan's decisions.

The pieces here are pure (no HTTP, no MLflow); the gateway service and the rollout controller drive
them.
"""

from online_rl.rollout.controller import RolloutConflict, RolloutController, RolloutState, RolloutStore
from online_rl.rollout.offpolicy import OffPolicyEstimate, snips
from online_rl.rollout.plan import ArmHealth, Decision, Evidence, Guardrails, RolloutPlan, decide
from online_rl.rollout.rewards import RewardPoint, RewardTally
from online_rl.rollout.routing import Route, route_request
from online_rl.rollout.sequential import ArmStats, Comparison, compare
from online_rl.rollout.split import BUCKETS, Arm, arm_for, bucket

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
    "RewardPoint",
    "RewardTally",
    "RolloutConflict",
    "RolloutController",
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
