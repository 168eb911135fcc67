"""How a gateway process picks each request's version, and where it reports the answer's health.

- `LocalRouting` (role `all`): by the state of the rollout loop in this process, into its health log.
- `SharedRouting` (roles `proxy` and `controller`): by the newest state on the bus (`RolloutFeed`),
  and the health goes to the bus (`HealthReporter`) for whichever process runs the rollout. The route
  is the same pure function of (state, champion, user), so every proxy gives a user the same arm.
"""

from __future__ import annotations

from typing import Protocol

from online_rl.config import Settings
from online_rl.registry import serving_name
from online_rl.rollout import RolloutState, Route
from online_rl.rollout.driver import RolloutLoop
from online_rl.rollout.routing import route_request
from online_rl.rollout.shared import HealthReporter, RolloutFeed

__all__ = ["LocalRouting", "Routing", "SharedRouting"]


class Routing(Protocol):
    @property
    def state(self) -> RolloutState | None: ...

    def route(self, user_id: str, override: str | None = None) -> Route: ...

    def record(self, model: str, latency_s: float, ok: bool) -> None: ...


class LocalRouting:
    def __init__(self, loop: RolloutLoop) -> None:
        self.loop = loop

    @property
    def state(self) -> RolloutState | None:
        return self.loop.controller.state

    def route(self, user_id: str, override: str | None = None) -> Route:
        return self.loop.route(user_id, override)

    def record(self, model: str, latency_s: float, ok: bool) -> None:
        self.loop.health.record(self.loop.key(model), latency_s, ok)


class SharedRouting:
    def __init__(self, settings: Settings, feed: RolloutFeed, reporter: HealthReporter) -> None:
        self.feed, self.reporter = feed, reporter
        self.registered = settings.mlflow.registered_model
        self.base_model = settings.model.name
        self.holdout = settings.gateway.holdout

    @property
    def state(self) -> RolloutState | None:
        return self.feed.state

    def route(self, user_id: str, override: str | None = None) -> Route:
        champion = self.feed.champion
        name = serving_name(self.registered, champion) if champion is not None else None
        return route_request(self.feed.state, self.base_model, user_id, override, name, self.holdout)

    def record(self, model: str, latency_s: float, ok: bool) -> None:
        self.reporter.record("base" if model == self.base_model else model, latency_s, ok)
