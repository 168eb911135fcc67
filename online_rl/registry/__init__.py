"""Adapter versions: lineage manifests, the MLflow registry, and who may do what in it."""

from online_rl.registry.access import (
    Credentials,
    RegistryAuth,
    grant_access,
    use_credentials,
    write_auth_config,
)
from online_rl.registry.errors import AdapterRejected, RegistryAccessError
from online_rl.registry.lineage import (
    ADAPTER_WEIGHTS,
    LINEAGE_NAME,
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
    "Credentials",
    "LineageManifest",
    "PublishedVersion",
    "RegistryAccessError",
    "RegistryAuth",
    "adapter_files",
    "alias_version",
    "check_version_source",
    "download_version",
    "file_sha256",
    "folder_files",
    "grant_access",
    "load_signing_key",
    "new_signing_key",
    "public_key_text",
    "publish_adapter",
    "read_lineage",
    "serving_name",
    "use_credentials",
    "verify_adapter_dir",
    "write_auth_config",
    "write_folder",
    "write_lineage",
]
