"""Publishing an adapter version: run artifacts, a registered model version, an alias.

A version's files are logged under the trainer's MLflow run, then registered as a new version of the
registered model (its lineage fields as version tags, so the MLflow UI shows them) and given an alias
(`challenger` by default). The serving name is `<registered>-v<version>`, never reused.

Knows MLflow's client and the lineage manifest; knows nothing about training.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from online_rl.registry.lineage import folder_files, verify_adapter_dir

if TYPE_CHECKING:
    from mlflow import MlflowClient

__all__ = ["PUBLISH_KEY_TAG", "PublishedVersion", "adapter_files", "alias_version", "check_version_source",
           "download_version", "find_published", "publish_adapter", "serving_name"]

logger = logging.getLogger(__name__)

# The version tag that makes a publish idempotent: a driver that crashed after registering finds the
# version its write-ahead checkpoint named by this key instead of registering a second one.
PUBLISH_KEY_TAG = "publish_key"


def serving_name(registered_model: str, version: str | int) -> str:
    """The immutable name a version is served under."""
    return f"{registered_model}-v{version}"


@dataclass(frozen=True)
class PublishedVersion:
    registered_model: str
    version: str
    alias: str | None
    source: str

    @property
    def serving_name(self) -> str:
        return serving_name(self.registered_model, self.version)

    @property
    def uri(self) -> str:
        return f"models:/{self.registered_model}/{self.version}"


def publish_adapter(client: MlflowClient, run_id: str, folder: Path, registered_model: str,
                    artifact_path: str, alias: str | None = "challenger",
                    publish_key: str | None = None) -> PublishedVersion:
    """Log the sealed adapter in `folder` under `run_id`, register it and point `alias` at it. With
    `publish_key`, the version is tagged with it (`find_published` finds it again after a crash)."""
    from mlflow.exceptions import MlflowException

    from online_rl.faults import failpoint

    manifest = verify_adapter_dir(folder)  # never register what serving would refuse
    client.log_artifacts(run_id, str(folder), artifact_path)
    try:
        client.create_registered_model(registered_model, description="LoRA adapters trained by online-rl")
    except MlflowException as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    source = f"{client.get_run(run_id).info.artifact_uri}/{artifact_path}"
    tags = {
        "base_model": manifest.base_model,
        "base_model_sha256": manifest.base_model_sha256 or "",
        "adapter_sha256": manifest.adapter_sha256,
        "reward_mapping_version": manifest.reward_mapping_version or "",
        "behaviour_versions": ",".join(manifest.behaviour_versions),
        "parent_version": manifest.parent_version or "",
        "config_hash": manifest.config_hash or "",
        "offsets": ";".join(f"{topic}/{part}:{first}-{end}"
                            for topic, parts in sorted(manifest.offsets.items())
                            for part, (first, end) in sorted(parts.items())),
        "kl_anchor": manifest.kl_anchor or "",
        "signer": manifest.signer or "",
        "signature": manifest.signature or "",
        **{f"eval.{name}": f"{value:.6g}" for name, value in manifest.eval.items()},
    }
    if publish_key is not None:
        tags[PUBLISH_KEY_TAG] = publish_key
    created = client.create_model_version(registered_model, source=source, run_id=run_id, tags=tags)
    version = str(created.version)
    failpoint("registry.after_register")
    if alias:
        client.set_registered_model_alias(registered_model, alias, version)
    logger.info("published %s (%s) as %s%s", serving_name(registered_model, version),
                manifest.adapter_sha256[:12], source, f", alias {alias}" if alias else "")
    return PublishedVersion(registered_model, version, alias, source)


def find_published(client: MlflowClient, registered_model: str, publish_key: str) -> PublishedVersion | None:
    """The version registered under `publish_key` (see `publish_adapter`), or None when there is none:
    a publish that died before `create_model_version` left, at most, unregistered run artifacts."""
    from mlflow.exceptions import MlflowException

    if not publish_key.isalnum():  # it goes into a filter string
        raise ValueError(f"publish key {publish_key!r} should be letters and digits")
    try:
        found = client.search_model_versions(
            f"name='{registered_model}' and tags.{PUBLISH_KEY_TAG}='{publish_key}'")
    except MlflowException as error:
        if error.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    if not found:
        return None
    version = min(found, key=lambda v: int(v.version))  # one key registers one version
    return PublishedVersion(registered_model, str(version.version), None, str(version.source))


def alias_version(client: MlflowClient, registered_model: str, alias: str) -> str | None:
    """The version `alias` points at, or None when the model or the alias does not exist (yet)."""
    from mlflow.exceptions import MlflowException

    try:
        return str(client.get_model_version_by_alias(registered_model, alias).version)
    except MlflowException as error:
        if error.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise


def check_version_source(client: MlflowClient, registered_model: str, version: str, source: str,
                         allowed_roots: Sequence[str]) -> None:
    """Raise ValueError unless `source` lies inside the artifacts of the run that registered the
    version, and that run's artifacts lie under one of `allowed_roots` (the registry's own store):
    a version registered by hand with a source elsewhere is never fetched."""
    uri = f"models:/{registered_model}/{version}"
    run_id = client.get_model_version(registered_model, version).run_id
    if not run_id:
        raise ValueError(f"{uri} was registered without a run; only versions logged from a training run are "
                         "served (publish it with `online-rl adapter publish`)")
    run_root = _plain(client.get_run(run_id).info.artifact_uri).rstrip("/")
    source = _plain(source)
    if ".." in source.split("/") or not (source == run_root or source.startswith(run_root + "/")):
        raise ValueError(f"{uri}'s source {source!r} lies outside the artifacts of run {run_id} "
                         f"({run_root}); it was not published by the trainer and is not fetched")
    roots = [_plain(root).rstrip("/") for root in allowed_roots]
    if not any(run_root == root or run_root.startswith(root + ("" if root.endswith(":") else "/"))
               for root in roots):
        raise ValueError(f"{uri}'s run {run_id} keeps its artifacts at {run_root}, outside the registry's "
                         f"artifact store ({', '.join(allowed_roots)}); set mlflow.artifact_root if that "
                         "store is yours")


def _plain(uri: str) -> str:
    """A local file URI as the path it names (MLflow writes local artifact roots either way)."""
    return uri[len("file://"):] if uri.startswith("file://") else uri


def download_version(tracking_uri: str, registered_model: str, version: str, dest: Path,
                     allowed_roots: Sequence[str] | None = None) -> Path:
    """Download a registered version's files into `dest` from the store at `tracking_uri` (its model
    registry too, whatever this process's global MLflow settings say); returns the folder holding
    `adapter_config.json`. Raises MLflow's exception when the store does not have it. With
    `allowed_roots`, the version's source is checked first (`check_version_source`)."""
    import mlflow.artifacts
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    source = client.get_model_version_download_uri(registered_model, version)
    if allowed_roots is not None:
        check_version_source(client, registered_model, version, source, allowed_roots)
    got = Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(dest),
                                                   tracking_uri=tracking_uri))
    folders = [p.parent for p in got.rglob("adapter_config.json")]
    if len(folders) != 1:
        raise ValueError(f"models:/{registered_model}/{version} should hold one adapter folder, "
                         f"found {len(folders)}")
    return folders[0]


def adapter_files(client: MlflowClient, registered_model: str, version: str) -> dict[str, bytes]:
    """A registered version's adapter files (weights, config, lineage), checked against its lineage
    manifest, as bytes: ready to ship to a worker on another node."""
    with tempfile.TemporaryDirectory(prefix="orl-version-") as tmp:
        folder = download_version(client.tracking_uri, registered_model, version, Path(tmp))
        verify_adapter_dir(folder)
        return folder_files(folder)
