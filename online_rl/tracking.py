"""MLflow tracking store set-up: a local SQLite store by default, or the configured server.

Knows where the store is and how to reach it; knows nothing about what gets logged.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from online_rl.errors import EnvironmentProblem
from online_rl.models.embedded import ensure_writable

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from online_rl.config import Settings

__all__ = ["ensure_experiment", "mlflow_client", "registry_artifact_roots"]


def mlflow_client(settings: Settings) -> MlflowClient:
    """Point MLflow at the configured store (creating the local SQLite one) and return a client.

    The store is both the tracking server and the model registry, for the client and for the
    process's global MLflow calls (`models:/` URIs): a registry set elsewhere never takes over."""
    import mlflow

    uri = settings.mlflow_tracking_uri
    if not settings.mlflow.tracking_uri:
        ensure_writable(settings.cache_dir / "mlflow")
    try:
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
        client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
        client.search_experiments(max_results=1)  # opens (and migrates) the store now, not later
    except Exception as exc:  # MLflow raises many exception types for an unusable store
        raise EnvironmentProblem(
            f"cannot open the MLflow tracking store {uri!r}: {exc}; fix ORL_MLFLOW__TRACKING_URI"
        ) from exc
    return client


def ensure_experiment(client: MlflowClient, name: str, settings: Settings) -> str:
    """The id of experiment `name`, created with the configured artifact root if it is new."""
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        return str(existing.experiment_id)
    if settings.mlflow.artifact_root is None and settings.mlflow_tracking_uri.startswith(("http://", "https://")):
        return str(client.create_experiment(name))  # a tracking server keeps (and serves) the artifacts
    root = settings.mlflow_artifact_root
    if "://" not in root:
        ensure_writable(Path(root))
    return str(client.create_experiment(name, artifact_location=f"{root.rstrip('/')}/{name}"))


def registry_artifact_roots(settings: Settings) -> list[str]:
    """Where the registry's versions may keep their files: what serving accepts as a version's source
    (see `online_rl.registry.check_version_source`). A tracking server's own store (mlflow-artifacts:)
    when there is one, and the configured artifact root."""
    server = settings.mlflow_tracking_uri.startswith(("http://", "https://"))
    roots = ["mlflow-artifacts:"] if server else []
    if settings.mlflow.artifact_root is not None or not server:
        roots.append(settings.mlflow_artifact_root)
    return roots
