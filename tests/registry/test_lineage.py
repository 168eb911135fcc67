"""The lineage manifest: adapters whose files do not match it are refused, with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from online_rl.errors import ConfigError
from online_rl.registry import AdapterRejected, read_lineage, verify_adapter_dir, write_lineage
from tests.factories import lora_adapter


@pytest.fixture(scope="module")
def adapter(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lora_adapter(tiny_model, tmp_path_factory.mktemp("lineage") / "a", "tiny")


def copy(folder: Path, dest: Path) -> Path:
    dest.mkdir()
    for item in folder.iterdir():
        (dest / item.name).write_bytes(item.read_bytes())
    return dest


def test_a_sealed_adapter_verifies_and_records_its_hashes(adapter: Path) -> None:
    manifest = verify_adapter_dir(adapter, base_model="tiny")
    assert manifest.base_model == "tiny"
    assert {"adapter_model.safetensors", "adapter_config.json"} <= set(manifest.files)
    assert read_lineage(adapter).adapter_sha256 == manifest.adapter_sha256


def test_changed_weights_are_refused(adapter: Path, tmp_path: Path) -> None:
    bad = copy(adapter, tmp_path / "bad")
    weights = bad / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(AdapterRejected, match=r"adapter_model.safetensors has sha256 .* but the lineage"):
        verify_adapter_dir(bad)


def test_pickle_weights_are_refused_even_with_a_manifest(adapter: Path, tmp_path: Path) -> None:
    bad = copy(adapter, tmp_path / "pickle")
    (bad / "adapter_model.bin").write_bytes(b"not loaded")
    with pytest.raises(AdapterRejected, match=r"pickle weights .*adapter_model.bin.*safetensors"):
        verify_adapter_dir(bad)


def test_missing_manifest_and_wrong_base_are_refused(adapter: Path, tmp_path: Path) -> None:
    bare = copy(adapter, tmp_path / "bare")
    (bare / "lineage.json").unlink()
    with pytest.raises(AdapterRejected, match=r"no lineage.json"):
        verify_adapter_dir(bare)
    with pytest.raises(AdapterRejected, match="trained on 'tiny' but this service serves 'other'"):
        verify_adapter_dir(adapter, base_model="other")


def test_write_lineage_refuses_a_folder_without_weights(tmp_path: Path) -> None:
    with pytest.raises(AdapterRejected, match=r"no adapter_model.safetensors"):
        write_lineage(tmp_path, "tiny")


def test_only_a_manifest_the_trainer_signed_is_trusted(adapter: Path, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from online_rl.registry import load_signing_key, new_signing_key

    pem, public = new_signing_key()
    (tmp_path / "trainer.pem").write_bytes(pem)
    key = load_signing_key(tmp_path / "trainer.pem")
    signed = copy(adapter, tmp_path / "signed")
    manifest = write_lineage(signed, "tiny", key, parent_version="policy-v1")
    assert manifest.signer == public and verify_adapter_dir(signed, "tiny", [public]).signature
    assert verify_adapter_dir(adapter, "tiny").signature is None  # no trusted keys: hashes only
    # an unsigned manifest has no signature fields at all (serving from before signing reads it)
    assert not {"signer", "signature"} & set(json.loads((adapter / "lineage.json").read_text()))

    # unsigned, signed by another key, or a signed manifest edited afterwards: refused
    with pytest.raises(AdapterRejected, match=r"is not signed.*mlflow.trusted_signers"):
        verify_adapter_dir(adapter, "tiny", [public])
    forger = copy(adapter, tmp_path / "forged")
    other = load_pem_private_key(new_signing_key()[0], password=None)
    write_lineage(forger, "tiny", other)  # type: ignore[arg-type]
    with pytest.raises(AdapterRejected, match=r"not in mlflow.trusted_signers"):
        verify_adapter_dir(forger, "tiny", [public])
    edited = copy(signed, tmp_path / "edited")
    text = (edited / "lineage.json").read_text()
    (edited / "lineage.json").write_text(text.replace("policy-v1", "policy-v9"))
    with pytest.raises(AdapterRejected, match=r"signature does not match"):
        verify_adapter_dir(edited, "tiny", [public])
    riding = copy(signed, tmp_path / "riding")  # a file added beside the signed ones
    (riding / "tokenizer.json").write_text("{}")
    with pytest.raises(AdapterRejected, match=r"files its signed manifest does not list \(tokenizer.json\)"):
        verify_adapter_dir(riding, "tiny", [public])
    # new weights with the hashes rewritten to match, the trainer's signature kept: refused
    swapped = copy(signed, tmp_path / "swapped")
    weights = swapped / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    forged = read_lineage(swapped)
    from online_rl.registry import file_sha256

    digest = file_sha256(weights)
    forged.adapter_sha256, forged.files["adapter_model.safetensors"] = digest, digest
    (swapped / "lineage.json").write_text(forged.model_dump_json())
    with pytest.raises(AdapterRejected, match=r"signature does not match"):
        verify_adapter_dir(swapped, "tiny", [public])
    (tmp_path / "bad.pem").write_text("not a key")
    with pytest.raises(ConfigError, match=r"mlflow.signing_key_file.*online-rl keys signing"):
        load_signing_key(tmp_path / "bad.pem")
