"""The demo's exceptions: a demo that cannot run. Knows nothing about how the loop is launched."""

from __future__ import annotations

from online_rl.errors import OnlineRLError

__all__ = ["DemoError"]


class DemoError(OnlineRLError):
    """The demo cannot run (feedback it cannot measure, the loop not up, or a component not ready)."""
