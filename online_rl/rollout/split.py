"""Sticky traffic splitting: which version answers a user's request during a canary.

A user's bucket is a hash of (rollout id, user id) into [0, 10000). The challenger takes the buckets
below its weight, so raising the weight only ever moves users from the champion to the challenger:
a user never flips back and forth between versions while a rollout advances, and a new rollout (a
new id) reshuffles who goes first. A holdout (`gateway.holdout`) is a fixed share of users, chosen by
their id alone, whom the base model serves through every rollout: the concurrent baseline that says
what learning has gained, measured in the same period as the versions. Pure: no HTTP, no MLflow.
"""

from __future__ import annotations

import hashlib
from typing import Literal

__all__ = ["BUCKETS", "Arm", "arm_for", "bucket", "in_holdout"]

Arm = Literal["champion", "challenger", "holdout"]
BUCKETS = 10_000


def bucket(rollout_id: str, user_id: str) -> int:
    """The user's fixed place in [0, BUCKETS) for this rollout."""
    digest = hashlib.blake2b(f"{rollout_id}\x00{user_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % BUCKETS


def arm_for(rollout_id: str, user_id: str, challenger_weight: float) -> Arm:
    """The arm that serves `user_id` while the challenger has `challenger_weight` (0-1) of traffic."""
    if not 0.0 <= challenger_weight <= 1.0:
        raise ValueError(f"challenger weight {challenger_weight} must lie in [0, 1]")
    return "challenger" if bucket(rollout_id, user_id) < round(challenger_weight * BUCKETS) else "champion"


def in_holdout(user_id: str, share: float) -> bool:
    """Whether `user_id` is among the `share` (0-1) of users the base model always serves."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"holdout share {share} must lie in [0, 1)")
    return share > 0 and bucket("holdout", user_id) < round(share * BUCKETS)
