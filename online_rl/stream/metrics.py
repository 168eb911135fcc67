"""The joiner's Prometheus metrics (`online-rl join --metrics-port`), read from the joiner when scraped.

- `orl_joiner_records_total{outcome}`: what the join did with what it read, over committed steps
  (joined, defaulted, pairs, late_feedback, duplicate_feedback, wrong_partition, forwarded_out, ...).
- `orl_joiner_tasks`: partitions this replica holds; `orl_joiner_open_requests`: requests in its state.
- `orl_joiner_lag_records{topic}`: unread records on its inputs when it last looked (the HPA's signal
  is the consumer group's lag as Kafka's exporter reports it; this one is the replica's own view).
- `orl_joiner_watermark_seconds`: the oldest watermark among its tasks (event time, Unix seconds).
- `orl_joiner_step_retries_total`, `orl_joiner_producers_replaced_total`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from online_rl.stream.joiner import Joiner

__all__ = ["JoinerCollector", "joiner_registry"]


class JoinerCollector(Collector):
    """Reads the joiner's snapshot of its last committed step at scrape time."""

    def __init__(self, joiner: Joiner) -> None:
        self._joiner = joiner

    def collect(self) -> Iterator[Metric]:
        snap = self._joiner.snapshot  # replaced whole after each committed step: a consistent view
        records = CounterMetricFamily("orl_joiner_records", "What the join did with the records it read, "
                                      "over committed steps.", labels=["outcome"])
        for outcome, count in sorted(snap.stats.items()):
            records.add_metric([outcome], count)
        yield records
        yield GaugeMetricFamily("orl_joiner_tasks", "Partitions whose join this replica holds.",
                                value=snap.tasks)
        yield GaugeMetricFamily("orl_joiner_open_requests", "Request ids in this replica's join state.",
                                value=snap.open_requests)
        lag = GaugeMetricFamily("orl_joiner_lag_records", "Unread records on this replica's inputs when it "
                                "last looked (not while it reads full batches of a backlog).",
                                labels=["topic"])
        per_topic: dict[str, int] = {}
        for tp, behind in snap.lag.items():
            per_topic[tp.topic] = per_topic.get(tp.topic, 0) + behind
        for topic, behind in sorted(per_topic.items()):
            lag.add_metric([topic], behind)
        yield lag
        if snap.watermark is not None:
            yield GaugeMetricFamily("orl_joiner_watermark_seconds", "The oldest event-time watermark among "
                                    "this replica's tasks (Unix seconds).", value=snap.watermark)
        yield CounterMetricFamily("orl_joiner_step_retries", "Steps the group or the broker refused (rewound "
                                  "and retried).", value=snap.retries)
        yield CounterMetricFamily("orl_joiner_producers_replaced", "Transactional producers replaced after "
                                  "a fatal error or a commit of unknown outcome.",
                                  value=snap.producers_replaced)


def joiner_registry(joiner: Joiner) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(JoinerCollector(joiner))
    return registry
