"""The default MLflow store: a real SQLite tracking store and registry under the cache folder."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

from online_rl.config import Settings
from online_rl.errors import EnvironmentProblem
from online_rl.tracking import ensure_experiment, mlflow_client


def test_run_is_logged_and_read_back(local_settings: Settings, tmp_path: Path) -> None:
    client = mlflow_client(local_settings)
    experiment = ensure_experiment(client, "smoke", local_settings)
    with mlflow.start_run(experiment_id=experiment) as run:
        mlflow.log_param("algo", "dpo")
        mlflow.log_metric("loss", 0.5, step=1)
        adapter = tmp_path / "adapter.safetensors"
        adapter.write_bytes(b"weights")
        mlflow.log_artifact(str(adapter), artifact_path="adapter")

    fetched = client.get_run(run.info.run_id)
    assert fetched.data.params == {"algo": "dpo"}
    assert fetched.data.metrics == {"loss": 0.5}
    assert (local_settings.cache_dir / "mlflow" / "mlflow.db").is_file()

    name = local_settings.mlflow.registered_model
    client.create_registered_model(name)
    version = client.create_model_version(
        name, source=f"{run.info.artifact_uri}/adapter", run_id=run.info.run_id
    )
    client.set_registered_model_alias(name, "challenger", version.version)
    assert client.get_model_version_by_alias(name, "challenger").version == version.version
    files = Path(mlflow.artifacts.download_artifacts(f"models:/{name}@challenger"))
    assert (files / "adapter.safetensors").read_bytes() == b"weights"


def test_unwritable_cache_folder_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    settings = Settings(cache_dir=blocker / "cache")
    with pytest.raises(EnvironmentProblem, match=r"not writable.*ORL_CACHE_DIR"):
        mlflow_client(settings)
