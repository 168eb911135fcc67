"""Request health per version as the gateway saw it: the guardrails' error rate and p99 latency.

The gateway records every answer it relayed (version, whole-request latency, success); the analysis
asks for one version's health since its step began. Bounded: the newest `per_version` answers of
each version are kept. Pure: no HTTP.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from online_rl.rollout.plan import ArmHealth

__all__ = ["HealthLog"]


class HealthLog:
    """The newest answers per version: (time, latency seconds, ok)."""

    def __init__(self, per_version: int = 50_000, clock: Callable[[], float] = time.time) -> None:
        self._answers: dict[str, deque[tuple[float, float, bool]]] = {}
        self._per_version = per_version
        self._lock = threading.Lock()
        self.clock = clock

    def record(self, version: str, latency_s: float, ok: bool, at: float | None = None) -> None:
        """One answer (`at`: when it ended; default now: a proxy's reports carry their own)."""
        with self._lock:
            answers = self._answers.setdefault(version, deque(maxlen=self._per_version))
            answers.append((self.clock() if at is None else at, latency_s, ok))

    def health(self, version: str, since: float = 0.0) -> ArmHealth:
        with self._lock:
            recent = [(latency, ok) for at, latency, ok in self._answers.get(version, ()) if at >= since]
        if not recent:
            return ArmHealth()
        return ArmHealth(requests=len(recent), errors=sum(1 for _, ok in recent if not ok),
                         latencies=tuple(sorted(latency for latency, _ in recent)))
