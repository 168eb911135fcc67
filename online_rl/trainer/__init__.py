"""The long-running trainer: a single controller driving a Ray policy worker, with checkpoints that make
its effect exactly-once and MLflow versions for what it learns."""

from online_rl.trainer.checkpoint import Checkpoint, CheckpointStore, capture_rng, restore_rng
from online_rl.trainer.controller import Trainer, TrainerState
from online_rl.trainer.errors import CheckpointAhead, CheckpointCorrupt
from online_rl.trainer.samples import Routed, route

__all__ = [
    "Checkpoint",
    "CheckpointAhead",
    "CheckpointCorrupt",
    "CheckpointStore",
    "Routed",
    "Trainer",
    "TrainerState",
    "capture_rng",
    "restore_rng",
    "route",
]
