"""The library's exceptions.

Every error a user can cause or fix (bad config, a missing tool, a broken cache) is an
`OnlineRLError` whose message names what is wrong and how to fix it. Services map these to
HTTP status codes in one place; the CLI prints them without a traceback.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "EnvironmentProblem",
    "ModelError",
    "OnlineRLError",
]


class OnlineRLError(Exception):
    """Base class of every error the library raises on purpose."""


class ConfigError(OnlineRLError):
    """A configuration value is invalid; the message names the field and the fix."""


class EnvironmentProblem(OnlineRLError):
    """The machine lacks something a component needs (a tool, a free port, a writable folder)."""


class ModelError(OnlineRLError):
    """A model folder is missing, corrupt, or fails its verification."""
