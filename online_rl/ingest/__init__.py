"""Ingestion helpers shared by the HTTP services: API keys, rate limits, and the bus writer.

Nothing here knows about HTTP; the services turn these results into status codes.
"""

from online_rl.ingest.auth import ApiKeyStore, KeyInfo, authorize, check_subject, hash_key, new_key
from online_rl.ingest.errors import Forbidden, OverLimit, RateLimited, Unauthenticated
from online_rl.ingest.limits import TokenBuckets, UserCaps
from online_rl.ingest.writer import AsyncBusWriter, RecentIds

__all__ = [
    "ApiKeyStore",
    "AsyncBusWriter",
    "Forbidden",
    "KeyInfo",
    "OverLimit",
    "RateLimited",
    "RecentIds",
    "TokenBuckets",
    "Unauthenticated",
    "UserCaps",
    "authorize",
    "check_subject",
    "hash_key",
    "new_key",
]
