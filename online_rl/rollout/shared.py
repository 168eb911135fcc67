"""The rollout shared over the bus, for a gateway split into proxies and one controller.

The controller keeps its state and audit log on the compacted topic `<prefix>.rollout`
(`BusRolloutStore`: key `state`, one `audit/...` key per entry, beside the local files), and
publishes a heartbeat there (key `controller`: the champion MLflow names, who leads and where to
reach it). Proxies tail the topic (`RolloutFeed`) and route every request by the newest state, so
every proxy gives a user the same arm; when no controller is alive they keep routing by the last
one. Proxies report the health of each answer (version, latency, success) on
`<prefix>.gateway-health` (`HealthReporter`), which the controller's feed reads into its guardrails.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from online_rl.bus import Bus, BusError, Topics
from online_rl.rollout.state import RolloutState, RolloutStore

__all__ = ["BusRolloutStore", "HealthReporter", "RolloutFeed"]

logger = logging.getLogger(__name__)
STATE_KEY, CONTROLLER_KEY, AUDIT_PREFIX = b"state", b"controller", b"audit/"


def _state(value: bytes | None) -> RolloutState | None:
    if not value:
        return None
    try:
        return RolloutState(**json.loads(value))
    except (ValueError, TypeError) as exc:  # another writer's bytes: not ours to crash on
        logger.warning("the rollout topic holds a state that is not one (%s); ignored", exc)
        return None


class BusRolloutStore(RolloutStore):
    """`RolloutStore` whose state and audit log live on the bus (the local files are kept as well): a
    controller that takes over on another machine continues from them."""

    def __init__(self, root: Path, bus: Bus, topics: Topics) -> None:
        super().__init__(root)
        self.bus, self.topic = bus, topics.rollout
        self._producer = bus.producer()

    def load(self) -> RolloutState | None:
        latest: bytes | None = None
        found = False
        for record in self.bus.read_all(self.topic):
            if record.key == STATE_KEY:
                latest, found = record.value, True
        if not found:  # a gateway that ran as one process before: its file
            return super().load()
        return _state(latest)

    def save(self, state: RolloutState) -> None:
        super().save(state)
        self._producer.send(self.topic, json.dumps(asdict(state)).encode(), STATE_KEY)

    def audit(self, entry: dict[str, Any]) -> None:
        super().audit(entry)
        key = AUDIT_PREFIX + f"{entry.get('at', time.time()):017.6f}/{uuid.uuid4().hex[:8]}".encode()
        self._producer.send(self.topic, json.dumps(entry, sort_keys=True).encode(), key)

    def entries(self) -> list[dict[str, Any]]:
        out = []
        for record in self.bus.read_all(self.topic):
            if record.key is not None and record.key.startswith(AUDIT_PREFIX) and record.value:
                try:
                    entry = json.loads(record.value)
                except ValueError:
                    continue
                if isinstance(entry, dict):
                    out.append(entry)
        return out

    def heartbeat(self, champion: str | None, controller: str, url: str) -> None:
        """Who leads, where to reach it, and the champion it follows (proxies route by it)."""
        body = {"champion": champion, "controller": controller, "url": url, "at": time.time()}
        self._producer.send(self.topic, json.dumps(body).encode(), CONTROLLER_KEY)

    def close(self) -> None:
        self._producer.close()


class RolloutFeed:
    """Tails `<prefix>.rollout` (and, for a controller, `<prefix>.gateway-health`) in a thread: the
    newest state and heartbeat, and every health report handed to `on_health`."""

    def __init__(self, bus: Bus, topics: Topics,
                 on_health: Callable[[str, float, float, bool], None] | None = None) -> None:
        self.bus, self.topics, self.on_health = bus, topics, on_health
        self.state: RolloutState | None = None
        self.controller: dict[str, Any] = {}
        self.updated = 0.0  # when the newest state or heartbeat was read (this process's clock)
        self.caught_up = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def champion(self) -> str | None:
        champion = self.controller.get("champion")
        return champion if isinstance(champion, str) else None

    def heartbeat_age(self) -> float | None:
        """Seconds since the controller's newest heartbeat (by its clock); None if none was read."""
        at = self.controller.get("at")
        return time.time() - at if isinstance(at, int | float) else None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="orl-rollout-feed", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        topics = [self.topics.rollout] + ([self.topics.gateway_health] if self.on_health else [])
        while not self._stop.is_set():
            try:
                self._tail(topics)
            except Exception as exc:  # the bus away, or anything else: keep the last state (proxies go on
                logger.warning("reading the rollout topic failed (%s); retrying", exc)  # routing by it)
                self._stop.wait(1.0)

    def _tail(self, topics: list[str]) -> None:
        ends = {tp: end for tp, end in self.bus.end_offsets(self.topics.rollout).items() if end > 0}
        consumer = self.bus.consumer(f"orl-rollout-{uuid.uuid4().hex[:12]}", auto_offset_reset="earliest")
        consumer.subscribe(topics)
        # Until this read has reached where the topic ended when it began, only the newest record per key
        # counts (the compacted topic's head may still hold older states: applied one by one, they would
        # route users by a past weight for a moment); after that, each record as it comes.
        pending: dict[bytes | None, bytes | None] = {}
        reached = False
        try:
            while not self._stop.is_set():
                for record in consumer.poll(500, 0.2):
                    if record.topic == self.topics.rollout:
                        if reached:
                            self._apply(record.key, record.value)
                        else:
                            pending[record.key] = record.value
                    elif self.on_health is not None:
                        self._health(record.value)
                if not reached and all((consumer.position(tp) or 0) >= end for tp, end in ends.items()):
                    reached = True
                    for key, value in pending.items():
                        self._apply(key, value)
                    pending.clear()
                    self.caught_up.set()
        finally:
            consumer.close()

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if key == STATE_KEY:
            self.state = _state(value)
            self.updated = time.monotonic()
        elif key == CONTROLLER_KEY and value:
            try:
                body = json.loads(value)
            except ValueError:
                return
            if isinstance(body, dict):
                self.controller = body
                self.updated = time.monotonic()

    def _health(self, value: bytes | None) -> None:
        assert self.on_health is not None
        try:
            answers = json.loads(value or b"")
            for version, at, latency, ok in answers:
                self.on_health(str(version), float(at), float(latency), bool(ok))
        except (ValueError, TypeError) as exc:
            logger.debug("a health report that is not one: %s", exc)


class HealthReporter:
    """A proxy's answers (version, when, latency, success), published every `every_s` seconds as one
    record on `<prefix>.gateway-health`. Bounded: past `max_pending` unsent answers the oldest are
    dropped (the bus away must not grow a proxy's memory)."""

    def __init__(self, bus: Bus, topics: Topics, every_s: float, max_pending: int = 200_000) -> None:
        self.bus, self.topic = bus, topics.gateway_health
        self.every_s, self.max_pending = every_s, max_pending
        self.name = uuid.uuid4().hex[:12]
        self.dropped = 0
        self._pending: list[tuple[str, float, float, bool]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._producer = bus.producer()

    def record(self, version: str, latency_s: float, ok: bool) -> None:
        with self._lock:
            self._pending.append((version, time.time(), round(latency_s, 6), ok))
            if len(self._pending) > self.max_pending:
                cut = len(self._pending) - self.max_pending
                del self._pending[:cut]
                self.dropped += cut

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="orl-health-reporter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.flush()
        self._producer.close()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            self._producer.send(self.topic, json.dumps(batch).encode(), self.name.encode())
        except BusError as exc:
            with self._lock:  # back in front, for the next try
                self._pending[:0] = batch
            logger.warning("could not publish %d answers' health (%s); will retry", len(batch), exc)
