"""The library's exceptions: the base class, and those of the top-level modules.

Every error a user can cause or fix (bad config, a missing tool, a broken cache) is an
`OnlineRLError` whose message names what is wrong and how to fix it. Services map these to
HTTP status codes in one place; the CLI prints them without a traceback.

Each package keeps its own exceptions in its `errors.py` (`online_rl.bus.errors`,
`online_rl.serving.errors`, ...), all deriving from `OnlineRLError`; this module holds the ones of
the modules directly under `online_rl/` (`events`, `client`, `rewards`), which those modules also
export. It imports nothing of the library, so any module can import it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ConfigError",
    "DecodeError",
    "EnvironmentProblem",
    "FeedbackRejected",
    "MalformedRecord",
    "ModelError",
    "OnlineRLError",
    "UnmappedFeedback",
    "UnsupportedSchemaVersion",
]


class OnlineRLError(Exception):
    """Base class of every error the library raises on purpose."""


class ConfigError(OnlineRLError):
    """A configuration value is invalid; the message names the field and the fix."""


class EnvironmentProblem(OnlineRLError):
    """The machine lacks something a component needs (a tool, a free port, a writable folder)."""


class ModelError(OnlineRLError):
    """A model folder is missing, corrupt, or fails its verification."""


# online_rl.events


class DecodeError(OnlineRLError):
    """A record could not be turned into an event."""


class MalformedRecord(DecodeError):
    """The bytes are not a valid event (bad encoding, wrong type, failed validation)."""


class UnsupportedSchemaVersion(DecodeError):
    """The record was written with a newer schema than this code understands."""


# online_rl.rewards


class UnmappedFeedback(ConfigError):
    """The mapping has no rule for this feedback (e.g. an unknown implicit signal)."""


# online_rl.client


class FeedbackRejected(OnlineRLError):
    """The API refused the feedback for good (bad input, bad key); the message says why."""

    def __init__(self, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)
        super().__init__(f"feedback API answered {status}: {message}")
        self.status, self.body = status, body
