"""The long-running trainer: checkpoints (more with its issue)."""

from online_rl.trainer.checkpoint import (
    Checkpoint,
    CheckpointCorrupt,
    CheckpointStore,
    capture_rng,
    restore_rng,
)

__all__ = ["Checkpoint", "CheckpointCorrupt", "CheckpointStore", "capture_rng", "restore_rng"]
