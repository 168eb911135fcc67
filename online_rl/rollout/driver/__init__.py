"""The rollout's drivers: what runs the pure pieces of `online_rl.rollout` against the world.

- `canary.RolloutLoop`: every tick, reads MLflow's aliases, hot-swaps versions into the replicas
  (through the `Replicas` protocol), tallies rewards from the joined samples on the bus and carries
  out the plan's decisions;
- `decisions.RolloutController`: applies a decision to the rollout state and to MLflow (aliases,
  tags) with its audit entry;
- `gate.LogprobScorer`: the off-policy gate's scorer (the base model and a registered adapter).

The gateway service builds them; nothing here knows HTTP routes.
"""

from online_rl.rollout.driver.canary import Gate, RolloutLoop, plan_from_config
from online_rl.rollout.driver.decisions import RolloutController
from online_rl.rollout.driver.gate import LogprobScorer

__all__ = ["Gate", "LogprobScorer", "RolloutController", "RolloutLoop", "plan_from_config"]
