"""The lineage manifest: what an adapter version was made from, and the hashes that pin its weights.

Every adapter folder carries `lineage.json` beside `adapter_model.safetensors`. Serving refuses an
adapter whose files do not match the hashes recorded there, whose base model is not the one being
served, or that holds anything but safetensors weights (a pickle can run code when loaded).

The hashes alone vouch only for themselves: anyone can write a matching manifest. So the trainer signs
the manifest with its Ed25519 key (`mlflow.signing_key_file`), and serving, given the trainer's public
keys (`mlflow.trusted_signers`), loads only versions whose manifest one of them signed. The signature
covers every field, the files' hashes included, so it pins the weights too.

This module knows nothing about MLflow, engines or the trainer; it reads and writes files.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from online_rl.errors import ConfigError
from online_rl.registry.errors import AdapterRejected

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = [
    "ADAPTER_WEIGHTS",
    "LINEAGE_NAME",
    "LineageManifest",
    "file_sha256",
    "folder_files",
    "load_signing_key",
    "new_signing_key",
    "public_key_text",
    "read_lineage",
    "verify_adapter_dir",
    "write_folder",
    "write_lineage",
]

LINEAGE_NAME = "lineage.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


class LineageManifest(BaseModel):
    """What one adapter version was made from (see docs/architecture.md, Versions)."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = 1
    base_model: str = Field(min_length=1, description="Base model id the adapter was trained on.")
    base_model_sha256: str | None = Field(default=None, description="Fingerprint of the base weights.")
    adapter_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the safetensors file.")
    files: dict[str, str] = Field(description="Every adapter file and its sha256.")
    offsets: dict[str, dict[str, list[int]]] = Field(
        default_factory=dict, description="topic -> partition -> [first, next) offsets consumed."
    )
    reward_mapping_version: str | None = None
    behaviour_versions: list[str] = Field(default_factory=list)
    parent_version: str | None = None
    config_hash: str | None = None
    eval: dict[str, float] = Field(default_factory=dict)
    cold_start: dict[str, str | float | int] | None = Field(
        default=None,
        description="The cold-start mix trained alongside the stream: file sha256, weight, samples mixed in.",
    )
    kl_anchor: str | None = Field(
        default=None, description="What the KL term held the adapter to: 'base' or a champion's serving name."
    )
    created_at: float = Field(default_factory=time.time)
    signer: str | None = Field(default=None, description="The signing public key (base64), if signed.")
    signature: str | None = Field(default=None, description="Ed25519 signature (base64) of the rest.")


def _signed_bytes(stored: dict[str, object]) -> bytes:
    """What a signature covers: every other field of the manifest as stored (not as this version of the
    model would re-serialise it, so a field added later is covered too), as canonical JSON."""
    fields = {k: v for k, v in stored.items() if k != "signature"}
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def new_signing_key() -> tuple[bytes, str]:
    """A fresh Ed25519 key: its private PEM (for the trainer's Secret) and public text (for serving)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    return pem, public_key_text(key)


def public_key_text(key: Ed25519PrivateKey) -> str:
    """The public half of `key` as it is listed in `mlflow.trusted_signers` (base64 of 32 bytes)."""
    from cryptography.hazmat.primitives import serialization

    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def load_signing_key(path: Path) -> Ed25519PrivateKey:
    """The trainer's signing key from its PEM file (`mlflow.signing_key_file`)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"mlflow.signing_key_file: cannot read an unencrypted PEM private key from {path} "
                          f"({exc}); make one with `online-rl keys signing`") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"mlflow.signing_key_file: {path} is not an Ed25519 key; make one with "
                          "`online-rl keys signing`")
    return key


def _check_signature(manifest: LineageManifest, trusted: Sequence[str], folder: Path) -> None:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    stored = json.loads((folder / LINEAGE_NAME).read_text())  # read_lineage has parsed it already
    if manifest.signer is None or manifest.signature is None:
        raise AdapterRejected(f"{folder / LINEAGE_NAME} is not signed, and this service loads only versions "
                              "signed by a key in mlflow.trusted_signers (the trainer signs what it makes; "
                              "sign a hand-made adapter with `online-rl adapter seal --sign`)")
    if manifest.signer not in trusted:
        raise AdapterRejected(f"{folder / LINEAGE_NAME} is signed by {manifest.signer[:12]}…, which is not "
                              "in mlflow.trusted_signers; only the trainer's key may make servable versions")
    try:
        Ed25519PublicKey.from_public_bytes(base64.b64decode(manifest.signer, validate=True)).verify(
            base64.b64decode(manifest.signature, validate=True), _signed_bytes(stored))
    except (InvalidSignature, ValueError) as exc:
        raise AdapterRejected(f"{folder / LINEAGE_NAME}: the signature does not match the manifest; it "
                              "was changed after the trainer signed it (or forged): re-download the "
                              "version") from exc


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_files(folder: Path) -> None:
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in _PICKLE_SUFFIXES)
    if pickles:
        raise AdapterRejected(
            f"{folder} holds pickle weights ({', '.join(pickles)}); only safetensors are served. "
            "Save the adapter with `save_pretrained(..., safe_serialization=True)`"
        )
    for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
        if not (folder / name).is_file():
            raise AdapterRejected(f"{folder} has no {name}; it is not a PEFT LoRA adapter folder")


def write_lineage(folder: Path, base_model: str, signing_key: Ed25519PrivateKey | None = None,
                  **fields: object) -> LineageManifest:
    """Hash the adapter files in `folder` and write its `lineage.json` (other fields as given), signed
    with `signing_key` when one is given."""
    folder = Path(folder)
    _check_files(folder)
    files = {p.name: file_sha256(p) for p in sorted(folder.iterdir())
             if p.is_file() and p.name != LINEAGE_NAME}
    manifest = LineageManifest(base_model=base_model, adapter_sha256=files[ADAPTER_WEIGHTS],
                               files=files, **fields)  # type: ignore[arg-type]
    # unsigned: no signature fields at all, so that serving from before signing still reads it
    stored = manifest.model_dump(mode="json", exclude={"signer", "signature"})
    if signing_key is not None:
        stored["signer"] = public_key_text(signing_key)
        stored["signature"] = base64.b64encode(signing_key.sign(_signed_bytes(stored))).decode()
    (folder / LINEAGE_NAME).write_text(json.dumps(stored, indent=2, allow_nan=False))
    return LineageManifest.model_validate(stored)


def read_lineage(folder: Path) -> LineageManifest:
    path = Path(folder) / LINEAGE_NAME
    if not path.is_file():
        raise AdapterRejected(
            f"{folder} has no {LINEAGE_NAME}, so its weights cannot be verified; adapters made by the "
            "trainer carry one (for a hand-made adapter: `online-rl adapter seal <folder> --base <id>`)"
        )
    try:
        return LineageManifest.model_validate(json.loads(path.read_text()))
    except (ValueError, ValidationError) as exc:
        raise AdapterRejected(f"{path} is not a valid lineage manifest: {exc}") from exc


def verify_adapter_dir(folder: Path, base_model: str | None = None,
                       trusted: Sequence[str] = ()) -> LineageManifest:
    """Check that `folder` is a safetensors LoRA adapter whose files match its lineage manifest
    (and, when given, that it was trained on `base_model`, and that a key in `trusted` signed the
    manifest); return the manifest."""
    folder = Path(folder)
    if not folder.is_dir():
        raise AdapterRejected(f"{folder} is not a folder; give the adapter's folder")
    _check_files(folder)
    manifest = read_lineage(folder)
    if base_model is not None and manifest.base_model != base_model:
        raise AdapterRejected(
            f"the adapter was trained on {manifest.base_model!r} but this service serves "
            f"{base_model!r}; load it on a service with that base model"
        )
    recorded = dict(manifest.files)
    recorded.setdefault(ADAPTER_WEIGHTS, manifest.adapter_sha256)
    if recorded[ADAPTER_WEIGHTS] != manifest.adapter_sha256:
        raise AdapterRejected(f"{folder / LINEAGE_NAME} disagrees with itself about the weights' sha256")
    for name, expected in recorded.items():
        path = folder / name
        if not path.is_file():
            raise AdapterRejected(f"{path} is listed in the lineage manifest but missing")
        actual = file_sha256(path)
        if actual != expected:
            raise AdapterRejected(
                f"{name} has sha256 {actual[:12]}… but the lineage manifest says {expected[:12]}…; "
                "the files were changed or corrupted after the version was made: re-download it"
            )
    if trusted:
        _check_signature(manifest, trusted, folder)
        # the engine is handed the whole folder: with signed versions, nothing unsigned may ride along
        extra = sorted(p.name for p in folder.iterdir() if p.name != LINEAGE_NAME and p.name not in recorded)
        if extra:
            raise AdapterRejected(f"{folder} holds files its signed manifest does not list "
                                  f"({', '.join(extra)}); they were added after the trainer signed it: "
                                  "re-download the version")
    return manifest


def folder_files(folder: Path) -> dict[str, bytes]:
    """An adapter folder's files by name: how an adapter travels between Ray nodes and processes."""
    return {f.name: f.read_bytes() for f in Path(folder).iterdir() if f.is_file()}


def write_folder(folder: Path | str, files: dict[str, bytes]) -> Path:
    """Write `folder_files`' result back as a folder (names are taken as plain file names)."""
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / Path(name).name).write_bytes(data)
    return root
