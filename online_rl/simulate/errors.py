"""The simulation's exceptions: a learning run that could not finish. Knows nothing about the
components it drives."""

from __future__ import annotations

from online_rl.errors import OnlineRLError

__all__ = ["LearningError"]


class LearningError(OnlineRLError):
    """A learning run could not finish (the trainer or the joiner stopped, or a round timed out)."""
