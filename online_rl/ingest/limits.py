"""Rate limits per API key (token buckets) and caps per user (a sliding window).

The cap keeps one user from dominating training: past `per_window` events in `window_s`, their
feedback is refused until the window slides. Pure logic with an injectable clock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from online_rl.ingest.errors import OverLimit, RateLimited

__all__ = ["TokenBuckets", "UserCaps"]


@dataclass
class _Bucket:
    tokens: float
    stamp: float


class TokenBuckets:
    """One token bucket per key: `rate` events per second, bursts up to `burst`."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._buckets: dict[str, _Bucket] = {}

    def take(self, key: str, count: int = 1) -> None:
        """Spend `count` tokens or raise `RateLimited` (spending nothing)."""
        now = self._clock()
        bucket = self._buckets.setdefault(key, _Bucket(self.burst, now))
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.stamp) * self.rate)
        bucket.stamp = now
        if count > self.burst:
            raise OverLimit(f"a request of {count} events exceeds the burst limit of {self.burst:.0f}")
        if bucket.tokens < count:
            wait = (count - bucket.tokens) / self.rate
            raise RateLimited(f"rate limit of {self.rate:g} events/s for this API key reached", wait)
        bucket.tokens -= count


class UserCaps:
    """At most `per_window` accepted events per user id in any `window_s` seconds."""

    def __init__(self, per_window: int, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_window, self.window_s, self._clock = per_window, window_s, clock
        self._seen: dict[str, deque[float]] = {}
        self._reserved = 0

    def reserve(self, counts: dict[str, int]) -> None:
        """Count `counts` (user id -> events) against the caps, or raise without counting any.

        Check and count happen together, so concurrent requests cannot both slip under a cap;
        `release` gives the reservation back when the write then fails."""
        now = self._clock()
        for user, count in counts.items():
            if count > self.per_window:
                raise OverLimit(
                    f"{count} events for user {user!r} in one request exceed the cap of {self.per_window} "
                    f"per {self.window_s:g}s"
                )
            times = self._seen.get(user)
            if times is not None:
                while times and times[0] <= now - self.window_s:
                    times.popleft()
            used = len(times) if times else 0
            if used + count > self.per_window:
                wait = (times[0] + self.window_s - now) if times else self.window_s
                raise RateLimited(
                    f"user {user!r} reached the cap of {self.per_window} feedback events per "
                    f"{self.window_s:g}s (so that no single user dominates training)",
                    max(wait, 0.1),
                )
        for user, count in counts.items():
            self._seen.setdefault(user, deque()).extend([now] * count)
        self._reserved += 1
        if self._reserved % 10_000 == 0:  # now and then, forget users whose window has passed
            horizon = now - self.window_s
            self._seen = {u: t for u, t in self._seen.items() if t and t[-1] > horizon}

    def release(self, counts: dict[str, int]) -> None:
        """Give back a reservation (the newest entries of each user)."""
        for user, count in counts.items():
            times = self._seen.get(user)
            for _ in range(min(count, len(times) if times else 0)):
                assert times is not None
                times.pop()
