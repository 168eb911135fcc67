"""The inference service's state: the core (engine, adapters, logger), API keys and metrics.

Built once per app in `create_app`; routes reach it through `deps.ServiceDep`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from online_rl.config import Settings
from online_rl.ingest import ApiKeyStore, TokenBuckets
from online_rl.serving import InferenceCore

__all__ = ["InferenceService", "Metrics"]


class _Live(Collector):
    """Gauges read at scrape time: the interaction log and leases per version."""

    def __init__(self, service: InferenceService) -> None:
        self._service = service

    def collect(self) -> Iterator[GaugeMetricFamily]:
        core = self._service.core
        log = core.log
        if log is not None:
            for name, value, text in (
                ("orl_interactions_logged", log.stats.logged, "Interactions confirmed by the bus"),
                ("orl_interactions_dropped", log.stats.dropped, "Interactions dropped: log buffer full"),
                ("orl_interaction_log_failures", log.stats.failed_flushes, "Failed bus flushes (retried)"),
                ("orl_interaction_log_buffered", log.buffered, "Interactions waiting for the bus"),
                ("orl_interactions_answered_unconfirmed", core.unconfirmed,
                 "Answers sent before the bus confirmed their record (it was away or slow)"),
            ):
                yield GaugeMetricFamily(name, text, value=value)
        in_flight = GaugeMetricFamily("orl_inference_in_flight", "Requests running per version",
                                      labels=["version"])
        for info in core.adapters.versions():
            in_flight.add_metric([info.name], info.in_flight)
        yield in_flight


class Metrics:
    def __init__(self, service: InferenceService) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("orl_inference_requests", "Completions served", ["version", "outcome"],
                                registry=self.registry)
        self.tokens = Counter("orl_inference_completion_tokens", "Tokens generated", ["version"],
                              registry=self.registry)
        self.latency = Histogram("orl_inference_request_seconds", "Whole request time", ["version"],
                                 registry=self.registry,
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.first_token = Histogram("orl_inference_first_token_seconds", "Time to the first token",
                                     registry=self.registry,
                                     buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.registry.register(_Live(service))


class InferenceService:
    """Everything a request needs."""

    def __init__(self, settings: Settings, core: InferenceCore) -> None:
        api = settings.inference
        self.settings = settings
        self.core = core
        self.keys = ApiKeyStore.from_sources(api.api_keys, api.api_keys_file)
        self.buckets = TokenBuckets(api.rate_limit_per_s, api.rate_burst)  # requests per API key
        self.metrics = Metrics(self)
