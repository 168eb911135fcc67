"""The rollout flow's exceptions: a reward function that cannot be loaded, a combination rule that does
not hold together, a batch that cannot be scored. Knows nothing about Ray or the bus."""

from __future__ import annotations

from online_rl.errors import ConfigError, OnlineRLError

__all__ = ["FlowError", "RewardFunctionError", "RewardRuleError"]


class FlowError(OnlineRLError):
    """Base class of the rollout flow's errors (also: a batch whose columns differ in length)."""


class RewardFunctionError(FlowError, ConfigError):
    """A reward function's target cannot be imported or is not callable; the message names the field
    (`rewards.functions[i].target`) and the fix."""


class RewardRuleError(FlowError, ConfigError):
    """A combination rule names no weighted source, a source twice, or a weight that is not a number >= 0;
    the message names the field and the fix."""
