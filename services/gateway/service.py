"""The gateway's state: API keys, the replica pool, the routing, the rollout loop (where this process
runs it) and the metrics.

Built once per app in `create_app`; routes reach it through `deps.ServiceDep`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from online_rl.config import Settings
from online_rl.ingest import ApiKeyStore, TokenBuckets
from online_rl.rollout.driver import RolloutLoop
from online_rl.rollout.shared import RolloutFeed
from services.gateway.leader import Leadership
from services.gateway.replicas import ReplicaPool
from services.gateway.routing import Routing

__all__ = ["GatewayService", "Metrics"]


class _Live(Collector):
    """The rollout's weight and each replica's state, read at scrape time."""

    def __init__(self, service: GatewayService) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        state = self._service.routing.state
        weight = state.weight if state is not None and state.active else 0.0
        yield GaugeMetricFamily("orl_rollout_challenger_weight", "Challenger share of traffic", value=weight)
        down = GaugeMetricFamily("orl_gateway_replica_down", "1 while a replica is skipped",
                                 labels=["replica"])
        now = self._service.pool.clock()
        for replica in self._service.pool.replicas:
            down.add_metric([replica.url], float(replica.down_until > now))
        yield down
        loop = self._service.loop
        yield GaugeMetricFamily("orl_gateway_controller_leader", "1 while this process runs the rollout",
                                value=float(loop is not None))
        if loop is None:
            return
        # Where the rollout runs: the evidence it judges by, for dashboards and alerts.
        count = CounterMetricFamily("orl_rollout_rewards", "Rewards joined per version (0-1 scale) since the "
                                    "controller started reading the samples topic", labels=["version"])
        total = CounterMetricFamily("orl_rollout_reward_sum", "Sum of those rewards per version; "
                                    "rate(sum) / rate(count) is the mean reward over time",
                                    labels=["version"])
        for version in loop.tally.versions():
            stats = loop.tally.stats(version)
            count.add_metric([version], stats.n)
            total.add_metric([version], stats.mean * stats.n if stats.n else 0.0)
        yield count
        yield total
        lacking = GaugeMetricFamily("orl_rollout_replica_lacking", "1 while a replica lacks a version it "
                                    "should serve (it failed to load it; retried every interval)",
                                    labels=["replica"])
        for replica in self._service.pool.replicas:
            lacking.add_metric([replica.url], float(replica.url in loop.lagging))
        yield lacking
        running = state is not None and state.status == "running"
        age = loop.clock() - state.step_started if running and state is not None else 0.0
        yield GaugeMetricFamily("orl_rollout_step_age_seconds", "How long the running rollout step has "
                                "waited for its verdict (0 when none runs)", value=age)


class Metrics:
    def __init__(self, service: GatewayService) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("orl_gateway_requests", "Requests relayed", ["version", "arm", "outcome"],
                                registry=self.registry)
        self.latency = Histogram("orl_gateway_request_seconds", "Whole request time through the gateway",
                                 ["arm"], registry=self.registry,
                                 buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.failovers = Counter("orl_gateway_failovers", "Requests moved to another replica",
                                 registry=self.registry)
        self.registry.register(_Live(service))


class GatewayService:
    """Everything a request needs."""

    def __init__(self, settings: Settings, pool: ReplicaPool, routing: Routing,
                 loop: RolloutLoop | None = None, feed: RolloutFeed | None = None,
                 leadership: Leadership | None = None) -> None:
        api = settings.gateway
        self.settings = settings
        self.keys = ApiKeyStore.from_sources(api.api_keys, api.api_keys_file)
        self.buckets = TokenBuckets(api.rate_limit_per_s, api.rate_burst)  # requests per API key
        self.pool = pool
        self.routing = routing
        self.feed = feed  # roles proxy and controller: the rollout as the bus has it
        self.leadership = leadership  # role controller
        self._loop = loop  # role all
        self.metrics = Metrics(self)

    @property
    def loop(self) -> RolloutLoop | None:
        """The rollout loop, where this process runs it (role all; a controller holding the lease)."""
        if self.leadership is not None:
            return self.leadership.loop
        return self._loop
