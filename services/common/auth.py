"""Who is calling: one dependency per scope, the same in the three apps.

`require_scope(scope)` is the dependency that verifies the caller's API key for `scope` (and, where the
app limits it, spends a token of the key's rate); it raises the library's `Unauthenticated` (401),
`Forbidden` (403) or `RateLimited` (429), and each app's error table words them in its format
(`services.common.errors`). The app's `state.service` holds the `keys` and the `buckets`.
Knows nothing of any app's routes or wire format.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Literal, Protocol

from fastapi import Header, Request

from online_rl.ingest import ApiKeyStore, KeyInfo, TokenBuckets, authorize

__all__ = ["RateLimit", "require_scope"]

RateLimit = Literal["every key", "keys without admin", "none"]


class _Keyed(Protocol):
    keys: ApiKeyStore
    buckets: TokenBuckets


def require_scope(scope: str, *, rate_limit: RateLimit = "every key",
                  x_api_key: bool = False) -> Callable[..., Awaitable[KeyInfo]]:
    """The dependency that answers the caller's key for `scope`, from `Authorization: Bearer <key>`
    (or, with `x_api_key`, an `X-API-Key` header). `rate_limit` says whose requests spend a token of
    their key's rate here: every key's, those of keys without the `admin` scope (an operator's key,
    such as the gateway's relaying every user, is not limited), or none (the app counts elsewhere)."""

    async def caller(
        request: Request,
        authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
        api_key: Annotated[str | None, Header(alias="X-API-Key", include_in_schema=False)] = None,
    ) -> KeyInfo:
        service: _Keyed = request.app.state.service
        key = authorize(service.keys, authorization, scope, api_key if x_api_key else None)
        if rate_limit == "every key" or (rate_limit == "keys without admin" and "admin" not in key.scopes):
            service.buckets.take(key.key_id)  # RateLimited: 429 with Retry-After
        return key

    return caller
