"""The three services' public contracts do not drift unseen: each app's OpenAPI document is compared
with the copy committed under tests/services/openapi/ (every path, method, parameter, schema and
status code). A change to an API is made on purpose by rewriting the copies:

    ORL_WRITE_OPENAPI=1 .venv/bin/python -m pytest tests/services/test_openapi.py

and the diff of the copies is reviewed with the change.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from online_rl.bus.embedded import EmbeddedBus
from online_rl.config import Settings
from online_rl.ingest import new_key
from tests.conftest import TINY_NAME

COPIES = Path(__file__).parent / "openapi"


def _settings(tmp_path: Path, tiny_model: Path) -> Settings:
    digest = new_key()[1]
    return Settings(
        cache_dir=tmp_path / "cache",
        model={"name": TINY_NAME, "path": tiny_model},  # type: ignore[arg-type]
        bus={"topic_prefix": f"o{uuid.uuid4().hex[:8]}", "partitions": 1},  # type: ignore[arg-type]
        feedback_api={"api_keys": [digest]},  # type: ignore[arg-type]
        inference={"engine": "transformers", "max_model_len": 256,  # type: ignore[arg-type]
                   "api_keys": [f"{digest} inference,admin"]},
        gateway={"replicas": ["http://127.0.0.1:9"], "upstream_api_key": new_key()[0],  # type: ignore[arg-type]
                 "api_keys": [f"{digest} inference,admin"]},
    )


def _feedback(settings: Settings, bus: EmbeddedBus) -> FastAPI:
    from services.feedback.main import create_app

    return create_app(settings, bus)


def _inference(settings: Settings, bus: EmbeddedBus) -> FastAPI:
    from services.inference.main import create_app

    return create_app(settings, bus=bus)


def _gateway(settings: Settings, bus: EmbeddedBus) -> FastAPI:
    from services.gateway.main import create_app

    return create_app(settings, bus)


APPS: dict[str, Callable[[Settings, EmbeddedBus], FastAPI]] = {
    "feedback": _feedback, "inference": _inference, "gateway": _gateway}


def _document(app: FastAPI) -> dict[str, Any]:
    document = json.loads(json.dumps(app.openapi()))
    document["info"].pop("version", None)  # the package version moves with every release
    return document


@pytest.mark.parametrize("name", sorted(APPS))
def test_the_openapi_document_is_the_committed_one(name: str, tiny_model: Path, tmp_path: Path) -> None:
    bus = EmbeddedBus(tmp_path / "bus.db")
    try:
        document = _document(APPS[name](_settings(tmp_path, tiny_model), bus))
    finally:
        bus.close()
    copy = COPIES / f"{name}.json"
    if os.environ.get("ORL_WRITE_OPENAPI") == "1":
        copy.parent.mkdir(exist_ok=True)
        copy.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    assert copy.is_file(), f"no committed copy {copy}: write it with ORL_WRITE_OPENAPI=1"
    committed = json.loads(copy.read_text())
    assert sorted(document["paths"]) == sorted(committed["paths"]), "the API's paths changed"
    assert document == committed, (
        f"the {name} API's OpenAPI document differs from {copy}; if the change is intended, "
        "rewrite the copies with ORL_WRITE_OPENAPI=1 and review their diff")
