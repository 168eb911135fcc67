"""The trainer's exceptions: a checkpoint it cannot resume from. Knows nothing about Ray, MLflow or the
bus."""

from __future__ import annotations

from online_rl.errors import OnlineRLError

__all__ = ["CheckpointAhead", "CheckpointCorrupt"]


class CheckpointCorrupt(OnlineRLError):
    """A checkpoint folder is incomplete or its files do not match its manifest."""


class CheckpointAhead(OnlineRLError):
    """A checkpoint covers offsets the topic does not have (it was recreated or truncated)."""
