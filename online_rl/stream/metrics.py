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

import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from online_rl.stream.joiner import Joiner

__all__ = ["JoinerCollector", "joiner_registry"]


class JoinerCollector(Collector):
    """Reads the joiner's figures at scrape time (plain attribute reads: safe from the server's thread)."""

    def __init__(self, joiner: Joiner) -> None:
        self._joiner = joiner

    def collect(self) -> Iterator[Metric]:
        joiner = self._joiner
        records = CounterMetricFamily("orl_joiner_records", "What the join did with the records it read, "
                                      "over committed steps.", labels=["outcome"])
        for outcome, count in sorted(joiner.stats.items()):
            records.add_metric([outcome], count)
        yield records
        yield GaugeMetricFamily("orl_joiner_tasks", "Partitions whose join this replica holds.",
                                value=len(joiner.tasks))
        yield GaugeMetricFamily("orl_joiner_open_requests", "Request ids in this replica's join state.",
                                value=joiner.open_requests)
        lag = GaugeMetricFamily("orl_joiner_lag_records", "Unread records on this replica's inputs when it "
                                "last looked.", labels=["topic"])
        per_topic: dict[str, int] = {}
        for tp, behind in dict(joiner.last_lag).items():
            per_topic[tp.topic] = per_topic.get(tp.topic, 0) + behind
        for topic, behind in sorted(per_topic.items()):
            lag.add_metric([topic], behind)
        yield lag
        marks = [w for w in joiner.watermarks().values() if math.isfinite(w)]
        if marks:
            yield GaugeMetricFamily("orl_joiner_watermark_seconds", "The oldest event-time watermark among "
                                    "this replica's tasks (Unix seconds).", value=min(marks))
        yield CounterMetricFamily("orl_joiner_step_retries", "Steps the group or the broker refused (rewound "
                                  "and retried).", value=joiner.retries)
        yield CounterMetricFamily("orl_joiner_producers_replaced", "Transactional producers replaced after "
                                  "a fatal error or a commit of unknown outcome.",
                                  value=joiner.producers_replaced)


def joiner_registry(joiner: Joiner) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(JoinerCollector(joiner))
    return registry
