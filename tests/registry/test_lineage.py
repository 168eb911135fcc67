"""The lineage manifest: adapters whose files do not match it are refused, with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

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
