"""The feedback API's state and its one operation: accept events (limits, de-duplication, write).

Built once per app in `create_app`; routes reach it through `deps.IngestDep`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import Counter as MetricCounter

from online_rl.bus import Bus
from online_rl.config import Settings
from online_rl.events import Feedback, encode
from online_rl.ingest import ApiKeyStore, AsyncBusWriter, KeyInfo, RecentIds, TokenBuckets, UserCaps
from online_rl.ingest.writer import OutRecord

__all__ = ["FeedbackService", "Metrics", "Outcome"]


class Metrics:
    """Prometheus metrics of one app (its own registry, so several apps can live in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.accepted = MetricCounter("orl_feedback_accepted", "Feedback events written", ["kind"],
                                      registry=self.registry)
        self.duplicates = MetricCounter("orl_feedback_duplicates", "Repeated event ids acknowledged",
                                        registry=self.registry)
        self.rejected = MetricCounter("orl_feedback_rejected", "Requests refused", ["reason"],
                                      registry=self.registry)
        self.latency = Histogram("orl_feedback_request_seconds", "Request time", ["route"],
                                 registry=self.registry,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5))


@dataclass(frozen=True)
class Outcome:
    accepted: list[str]
    duplicates: list[str]


class FeedbackService:
    """Everything a request needs: keys, limits, the writer, recent ids, metrics."""

    def __init__(self, settings: Settings, bus: Bus) -> None:
        api = settings.feedback_api
        self.settings = settings
        self.bus = bus
        self.topics = settings.topics
        self.keys = ApiKeyStore.from_sources(api.api_keys, api.api_keys_file)
        self.buckets = TokenBuckets(api.rate_limit_per_s, api.rate_burst)
        self.caps = UserCaps(api.user_cap, api.user_cap_window_s)
        self.writer = AsyncBusWriter(bus, timeout_s=api.write_timeout_s)
        self.recent = RecentIds()
        self._in_flight: dict[str, asyncio.Future[None]] = {}
        self.metrics = Metrics()

    async def accept(self, events: Sequence[Feedback], key: KeyInfo) -> Outcome:
        """Write the new events; acknowledge repeats without writing them again.

        Raises `RateLimited` or `OverLimit` (nothing written) or `BusUnavailable` (retry)."""
        fresh: dict[str, Feedback] = {}
        duplicates: list[str] = []
        waits: list[asyncio.Future[None]] = []
        for event in events:
            if event.event_id in self.recent or event.event_id in fresh:
                duplicates.append(event.event_id)
            elif event.event_id in self._in_flight:  # the same id is being written right now
                duplicates.append(event.event_id)
                waits.append(self._in_flight[event.event_id])
            else:
                fresh[event.event_id] = event
        if fresh:
            await self._write(fresh, key)
        for wait in waits:  # a repeat is acknowledged only once the original is
            await asyncio.shield(wait)
        if duplicates:
            self.metrics.duplicates.inc(len(duplicates))
        return Outcome(list(fresh), duplicates)

    async def _write(self, fresh: dict[str, Feedback], key: KeyInfo) -> None:
        per_user = dict(Counter(e.user_id for e in fresh.values()))
        self.caps.reserve(per_user)
        try:
            self.buckets.take(key.key_id, len(fresh))
        except Exception:
            self.caps.release(per_user)
            raise
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for event_id in fresh:
            self._in_flight[event_id] = done
        ids = list(fresh)
        try:
            topic = self.topics.feedback
            records = [OutRecord(topic, e.request_id.encode(), encode(e)) for e in fresh.values()]
            await self.writer.write(records, on_confirmed=lambda: self.recent.add_all(ids))
        except BaseException as exc:
            self.caps.release(per_user)
            done.set_exception(exc)
            done.exception()  # retrieved: waiters re-raise it, nobody else needs to
            raise
        else:
            done.set_result(None)
        finally:
            for event_id in ids:
                self._in_flight.pop(event_id, None)
        for event in fresh.values():
            self.metrics.accepted.labels(event.kind.value).inc()

    def close(self) -> None:
        self.writer.close()
