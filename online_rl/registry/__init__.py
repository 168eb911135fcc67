"""Adapter versions: lineage manifests (and, with the trainer, the MLflow registry)."""

from online_rl.registry.lineage import (
    ADAPTER_WEIGHTS,
    LINEAGE_NAME,
    AdapterRejected,
    LineageManifest,
    file_sha256,
    folder_files,
    load_signing_key,
    new_signing_key,
    public_key_text,
    read_lineage,
    verify_adapter_dir,
    write_folder,
    write_lineage,
)
from online_rl.registry.publish import (
    PublishedVersion,
    adapter_files,
    alias_version,
    check_version_source,
    download_version,
    publish_adapter,
    serving_name,
)

__all__ = [
    "ADAPTER_WEIGHTS",
    "LINEAGE_NAME",
    "AdapterRejected",
    "LineageManifest",
    "PublishedVersion",
    "adapter_files",
    "alias_version",
    "check_version_source",
    "download_version",
    "file_sha256",
    "folder_files",
    "load_signing_key",
    "new_signing_key",
    "public_key_text",
    "publish_adapter",
    "read_lineage",
    "serving_name",
    "verify_adapter_dir",
    "write_folder",
    "write_lineage",
]
