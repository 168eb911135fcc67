"""Adapter versions: lineage manifests (and, with the trainer, the MLflow registry)."""

from online_rl.registry.lineage import (
    ADAPTER_WEIGHTS,
    LINEAGE_NAME,
    AdapterRejected,
    LineageManifest,
    file_sha256,
    read_lineage,
    verify_adapter_dir,
    write_lineage,
)

__all__ = [
    "ADAPTER_WEIGHTS",
    "LINEAGE_NAME",
    "AdapterRejected",
    "LineageManifest",
    "file_sha256",
    "read_lineage",
    "verify_adapter_dir",
    "write_lineage",
]
