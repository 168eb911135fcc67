"""The launcher's exceptions: a loop that could not be started or read. Knows nothing about what the
components do."""

from __future__ import annotations

from online_rl.errors import OnlineRLError

__all__ = ["LaunchError"]


class LaunchError(OnlineRLError):
    """A component could not be started (the message says which, why and where its log is)."""
