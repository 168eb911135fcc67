"""The rollout flow: rewards written as code, run out of the trainer's process, and the rule that
combines them with users' feedback and the learned reward model (see docs/rewards.md)."""

from __future__ import annotations

from online_rl.flow.dead_letters import dead_letter_failures
from online_rl.flow.errors import FlowError, RewardFunctionError, RewardRuleError
from online_rl.flow.functions import Failure, RewardFunctions, RewardFunctionsActor, RewardScores
from online_rl.flow.rewards import (
    FEEDBACK,
    REWARD_MODEL,
    RewardFn,
    RewardFunctionSpec,
    RewardRule,
    combine,
    load_reward_function,
)

__all__ = [
    "FEEDBACK",
    "REWARD_MODEL",
    "Failure",
    "FlowError",
    "RewardFn",
    "RewardFunctionError",
    "RewardFunctionSpec",
    "RewardFunctions",
    "RewardFunctionsActor",
    "RewardRule",
    "RewardRuleError",
    "RewardScores",
    "combine",
    "dead_letter_failures",
    "load_reward_function",
]
