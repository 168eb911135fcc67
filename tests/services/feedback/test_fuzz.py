"""An OpenAPI-driven fuzz run (schemathesis, valid and invalid inputs) against the feedback API:
no input gives a 5xx, and every error has the documented body."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis.strategies import SearchStrategy

from online_rl.bus.embedded import EmbeddedBus
from online_rl.ingest import new_key
from services.feedback.main import create_app
from tests.services.feedback.conftest import make_settings


@pytest.mark.slow
def test_no_generated_request_makes_the_api_fail(tmp_path: Path) -> None:
    key, digest = new_key()
    config = make_settings(tmp_path, [digest], rate_limit_per_s=1e6, rate_burst=1e6, user_cap=1_000_000)
    app = create_app(config, EmbeddedBus(tmp_path / "bus.db"))
    statuses: dict[str, set[int]] = {}
    with TestClient(app):  # runs the lifespan
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        operations = [(path, method) for path, item in schema.raw_schema["paths"].items() for method in item]
        assert ("/v1/feedback", "post") in operations and ("/v1/feedback/batch", "post") in operations
        for (path, method), mode in itertools.product(operations, schemathesis.GenerationMode):
            if mode is schemathesis.GenerationMode.NEGATIVE and method != "post":
                continue  # nothing to get wrong in a GET without parameters
            operation = schema[path][method.upper()]

            _fuzz(operation.as_strategy(generation_mode=mode), key,
                  statuses.setdefault(f"{method.upper()} {path}", set()))
    # Both the write path and the rejections were reached (a generated batch rarely has every
    # event valid across fields, so only its rejections are required).
    assert {202, 422} <= statuses["POST /v1/feedback"], statuses
    assert 422 in statuses["POST /v1/feedback/batch"], statuses


def _fuzz(strategy: SearchStrategy[schemathesis.Case], key: str, seen: set[int]) -> None:
    @given(case=strategy)
    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    def call(case: schemathesis.Case) -> None:
        response = case.call(headers={"Authorization": f"Bearer {key}"})
        seen.add(response.status_code)
        assert response.status_code < 500, response.text
        if response.status_code >= 400:
            body = response.json()
            assert body["type"] and body["message"], body

    call()
