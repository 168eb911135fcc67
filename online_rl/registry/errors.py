"""The registry's exceptions: an adapter folder that fails verification, and MLflow refusing to set up
the loop's users. Knows nothing about engines or the trainer."""

from __future__ import annotations

from online_rl.errors import OnlineRLError

__all__ = ["AdapterRejected", "RegistryAccessError"]


class AdapterRejected(OnlineRLError):
    """An adapter folder failed verification; the message says what is wrong and how to fix it."""


class RegistryAccessError(OnlineRLError):
    """MLflow refused to set up the loop's users (the message says what to do)."""
