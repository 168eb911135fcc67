"""Feedback API fixtures: the app over a real bus, API keys, and a live uvicorn server."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from online_rl.bus import Bus, Topics
from online_rl.config import BusConfig, FeedbackApiConfig, Settings
from online_rl.events import Feedback, decode
from online_rl.ingest import new_key
from online_rl.ports import free_port
from services.feedback.main import create_app


@dataclass
class Api:
    client: TestClient
    app: FastAPI
    bus: Bus
    topics: Topics
    key: str
    read_only_key: str
    alice_key: str  # bound to the user "alice"

    def auth(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    def feedback_on_bus(self) -> list[Feedback]:
        return [decode(r.value or b"", Feedback) for r in self.bus.read_all(self.topics.feedback)]


def make_settings(tmp_path: Path, digests: list[str], **api: Any) -> Settings:
    return Settings(
        cache_dir=tmp_path / "cache",
        bus=BusConfig(topic_prefix=f"t{uuid.uuid4().hex[:8]}", partitions=2),
        feedback_api=FeedbackApiConfig(api_keys=digests, **api),
    )


@pytest.fixture
def make_api(make_bus: Callable[..., Bus], tmp_path: Path) -> Iterator[Callable[..., Api]]:
    """Build the app over a real bus (each test runs on the embedded bus and on Kafka)."""
    made: list[TestClient] = []

    def make(bus: Bus | None = None, **api: Any) -> Api:
        key, digest = new_key()
        other, other_digest = new_key()
        alice, alice_digest = new_key()
        entries = [digest, f"{other_digest} inference", f"{alice_digest} user=alice"]
        settings = make_settings(tmp_path, entries, **api)
        the_bus = bus or make_bus()
        app = create_app(settings, the_bus)
        client = TestClient(app)
        client.__enter__()
        made.append(client)
        return Api(client, app, the_bus, settings.topics, key, other, alice)

    yield make
    for client in made:
        client.__exit__(None, None, None)


@pytest.fixture
def api(make_api: Callable[..., Api]) -> Api:
    return make_api()


def thumbs_body(request_id: str = "req-1", up: bool = True, user: str = "u1", **extra: Any) -> dict[str, Any]:
    return {"event_id": uuid.uuid4().hex, "request_id": request_id, "user_id": user, "kind": "thumbs",
            "value": 1 if up else -1, **extra}


@contextmanager
def serve(app: FastAPI, startup_timeout: float = 30.0) -> Iterator[str]:
    """Run `app` with uvicorn on a free local port in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not server.started:
        server.should_exit = True
        raise RuntimeError("the app did not start; see the log above")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
