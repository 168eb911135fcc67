"""Inference service fixtures: the app over a real engine and bus, served by uvicorn, with keys."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from online_rl.bus import Bus, Topics
from online_rl.bus.embedded import EmbeddedBus
from online_rl.config import BusConfig, InferenceConfig, ModelConfig, Settings
from online_rl.events import Interaction, decode
from online_rl.ingest import new_key
from services.inference.main import create_app
from tests.services.feedback.conftest import serve


@dataclass
class Server:
    url: str
    app: FastAPI
    bus: Bus
    topics: Topics
    key: str  # scopes: inference
    admin_key: str  # scopes: admin

    def openai(self, **options: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.key, max_retries=0, **options)

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, self.url + path, headers={"Authorization": f"Bearer {self.admin_key}"},
                             timeout=120, **kwargs)

    def interactions(self) -> list[Interaction]:
        return [decode(r.value or b"", Interaction) for r in self.bus.read_all(self.topics.interactions)]


ServerFactory = Callable[..., Server]


def server_settings(cache_dir: Path, model_dir: Path, name: str,
                    **inference: Any) -> tuple[Settings, str, str]:
    """Settings for one test server on its own topics, with an `inference` key and an `admin` key."""
    key, digest = new_key()
    admin_key, admin_digest = new_key()
    settings = Settings(
        cache_dir=cache_dir,
        model=ModelConfig(name=name, path=model_dir),
        bus=BusConfig(topic_prefix=f"t{uuid.uuid4().hex[:8]}", partitions=2),
        # float32 unless asked: the tests compare served log-probabilities with a float32 recomputation
        inference=InferenceConfig(api_keys=[f"{digest} inference", f"{admin_digest} admin"],
                                  **({"engine": "transformers", "max_model_len": 512, "precision": "fp32"}
                                     | inference)),
    )
    return settings, key, admin_key


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[ServerFactory]:
    """Serve the inference app for `model_dir` (served as `name`) on a real bus."""
    with ExitStack() as stack:

        def make(model_dir: Path, name: str, bus: Bus | None = None, trusted_signers: tuple[str, ...] = (),
                 tracking_uri: str | None = None, **inference: Any) -> Server:
            settings, key, admin_key = server_settings(tmp_path / "cache", model_dir, name, **inference)
            if trusted_signers or tracking_uri:
                update: dict[str, Any] = {"trusted_signers": list(trusted_signers)} if trusted_signers else {}
                if tracking_uri:
                    update["tracking_uri"] = tracking_uri
                settings = settings.model_copy(update={"mlflow": settings.mlflow.model_copy(update=update)})
            the_bus = bus or EmbeddedBus(tmp_path / f"bus-{uuid.uuid4().hex[:6]}.db")
            app = create_app(settings, bus=the_bus)
            url = stack.enter_context(serve(app))
            stack.callback(the_bus.close)
            return Server(url, app, the_bus, settings.topics, key, admin_key)

        yield make
