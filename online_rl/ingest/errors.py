"""Ingestion's exceptions: a request refused for its key (unknown, or without the scope) or for its
size or rate. The services answer each with its HTTP status (401, 403, 422, 429); nothing here knows
HTTP."""

from __future__ import annotations

from online_rl.errors import OnlineRLError

__all__ = ["Forbidden", "OverLimit", "RateLimited", "Unauthenticated"]


class Unauthenticated(OnlineRLError):
    """No key, or a key that is not known (HTTP 401)."""


class Forbidden(OnlineRLError):
    """A known key without the scope the call needs (HTTP 403)."""


class RateLimited(OnlineRLError):
    """Too many requests; retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class OverLimit(OnlineRLError):
    """A request that no amount of waiting would let through (larger than a limit)."""
