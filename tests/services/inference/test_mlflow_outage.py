"""A replica asked to load a version while the MLflow server is down (issue 27): the load is refused
as retryable (503), nothing is left on the adapter disk, the version already served keeps serving, and
the same load succeeds once the server is back."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import MlflowServer
from tests.services.inference.conftest import ServerFactory
from tests.services.inference.test_mlflow_adapters import register

pytestmark = pytest.mark.slow


def _load(version: str) -> dict[str, str]:
    return {"source": f"models:/policy/{version}", "alias": "policy"}


def test_a_load_while_mlflow_is_down_is_refused_as_retryable_and_serving_carries_on(
        make_server: ServerFactory, tiny_model: Path, adapters: list[Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # each request fails at once, not in minutes
    mlflow = MlflowServer(tmp_path / "mlflow")
    mlflow.start()
    try:
        server = make_server(tiny_model, "tiny-llama", tracking_uri=mlflow.url)
        settings = server.app.state.service.settings
        assert register(settings, adapters[0]) == "1" and register(settings, adapters[1]) == "2"
        loaded = server.admin("POST", "/admin/adapters", json=_load("1"))
        assert loaded.status_code == 201, loaded.text

        mlflow.kill()
        refused = server.admin("POST", "/admin/adapters", json=_load("2"))
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["type"] == "adapter_unavailable" and "retry" in refused.text
        assert refused.headers["Retry-After"] == "5"
        assert not [f for f in (settings.adapters_dir / "policy-v2").rglob("*") if f.is_file()]
        listed = server.admin("GET", "/admin/adapters").json()
        assert listed["aliases"] == {"policy": "policy-v1"}  # the rollout's version is untouched
        answer = server.openai().completions.create(model="policy", prompt="hello", max_tokens=3)
        assert answer.model == "policy-v1"

        mlflow.start()  # the same store, as a restarted pod
        again = server.admin("POST", "/admin/adapters", json=_load("2"))
        assert again.status_code == 201, again.text
        answer = server.openai().completions.create(model="policy", prompt="hello", max_tokens=3)
        assert answer.model == "policy-v2"
    finally:
        mlflow.kill()
