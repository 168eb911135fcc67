"""Serving's exceptions: what an engine, the adapter versions and the inference core may raise.
The inference service maps each to an HTTP status (services/inference/errors.py); nothing here knows
HTTP."""

from __future__ import annotations

from online_rl.errors import OnlineRLError

__all__ = ["AdapterLoadError", "AdapterUnavailable", "EngineError", "PromptTooLong", "UnknownModel",
           "VersionConflict"]


class EngineError(OnlineRLError):
    """Generation failed inside the engine."""


class AdapterLoadError(OnlineRLError):
    """An adapter could not be loaded; serving is unchanged and the message says why."""


class UnknownModel(OnlineRLError):
    """The requested model is neither the base, a loaded version nor an alias."""


class AdapterUnavailable(OnlineRLError):
    """The registry or artifact store failed while fetching a version: try again later."""


class VersionConflict(OnlineRLError):
    """The operation would break a rule about versions (reused name, unloading a served alias)."""


class PromptTooLong(OnlineRLError):
    """Prompt plus max_tokens exceed the engine's context; `field` names the one to shrink."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field
