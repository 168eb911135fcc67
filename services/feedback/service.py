"""The feedback API's state and its one operation: accept events (limits, de-duplication, write).

Built once per app in `create_app`; routes reach it through `deps.IngestDep`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import Counter as MetricCounter

from online_rl.bus import Bus, Topics
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
        self.topics = Topics(settings.bus.topic_prefix)
        self.keys = ApiKeyStore.from_sources(api.api_keys, api.api_keys_file)
        self.buckets = TokenBuckets(api.rate_limit_per_s, api.rate_burst)
        self.caps = UserCaps(api.user_cap, api.user_cap_window_s)
        self.writer = AsyncBusWriter(bus, timeout_s=api.write_timeout_s)
        self.recent = RecentIds()
        self.metrics = Metrics()

    async def accept(self, events: Sequence[Feedback], key: KeyInfo) -> Outcome:
        """Write the new events; acknowledge repeats without writing them again.

        Raises `RateLimited` (nothing written) or `BusUnavailable` (the client should retry)."""
        fresh: dict[str, Feedback] = {}
        duplicates: list[str] = []
        for event in events:
            if event.event_id in self.recent or event.event_id in fresh:
                duplicates.append(event.event_id)
            else:
                fresh[event.event_id] = event
        per_user = Counter(e.user_id for e in fresh.values())
        if fresh:
            self.caps.check(per_user)
            self.buckets.take(key.key_id, len(fresh))
            topic = self.topics.feedback
            await self.writer.write(
                [OutRecord(topic, e.request_id.encode(), encode(e)) for e in fresh.values()]
            )
            self.caps.record(per_user)
            for event in fresh.values():
                self.recent.add(event.event_id)
                self.metrics.accepted.labels(event.kind.value).inc()
        if duplicates:
            self.metrics.duplicates.inc(len(duplicates))
        return Outcome(list(fresh), duplicates)

    def close(self) -> None:
        self.writer.close()
