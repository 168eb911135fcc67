"""The inference app: `create_app(settings)` builds it; `python -m services.inference` serves it.

A thin layer over `online_rl.serving`: the OpenAI wire format, auth and error mapping here;
engines, adapter versions and interaction logging in the library.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from online_rl.bus import Bus, ensure_topics, open_bus
from online_rl.config import Settings
from online_rl.serving import AdapterManager, Engine, InferenceCore, InteractionLogger, build_engine
from online_rl.tracking import registry_artifact_roots
from services.common.app import edge_app
from services.common.serve import require_api_keys
from services.inference.errors import install_error_handlers
from services.inference.routes import admin, completions, health, models
from services.inference.service import InferenceService

__all__ = ["create_app"]


def create_app(settings: Settings, engine: Engine | None = None, bus: Bus | None = None,
               close_engine: bool = True) -> FastAPI:
    """The inference API over `engine` (default: built from the config) logging to `bus`
    (default: the configured bus)."""
    require_api_keys(settings, "inference")
    api = settings.inference
    own_bus = bus is None
    service_bus = bus or open_bus(settings)
    topics = settings.topics
    ensure_topics(service_bus, topics, settings.bus.partitions)
    engine = engine or build_engine(settings.model_dir, api, cache_dir=settings.cache_dir)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(settings.model_dir))
    manager = AdapterManager(engine, settings.model.name, settings.adapters_dir,
                             tracking_uri=settings.mlflow_tracking_uri,
                             trusted_signers=settings.mlflow.trusted_signers,
                             artifact_roots=registry_artifact_roots(settings))
    log = InteractionLogger(service_bus, topics.interactions, max_buffer=api.log_buffer)
    core = InferenceCore(engine, manager, tokenizer, log, api.log_confirm_s)
    service = InferenceService(settings, core)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        yield
        if close_engine:  # first the engine (no more answers), then the log (write what is left)
            await engine.close()
        await asyncio.to_thread(log.close)
        if own_bus:
            service_bus.close()

    return edge_app(
        "online-rl inference API",
        "OpenAI-compatible completions from the base model or a LoRA adapter version. "
        "Every answer carries a `request_id`: post feedback on it to the feedback API. "
        "Authenticate with `Authorization: Bearer <API key>` (scope `inference`; `admin` for /admin).",
        lifespan, service, install_error_handlers, [m.router for m in (completions, models, admin, health)],
        api.max_body_bytes,
    )
