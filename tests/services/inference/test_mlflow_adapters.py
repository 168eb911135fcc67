"""Loading adapter versions from a real MLflow registry by version and by alias."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

from online_rl.tracking import ensure_experiment, mlflow_client
from tests.services.inference.conftest import ServerFactory


def register(settings: object, folder: Path, name: str = "policy") -> str:
    """Log `folder` as run artifacts and register it as a new version of `name`; returns the version."""
    client = mlflow_client(settings)  # type: ignore[arg-type]
    experiment = ensure_experiment(client, "adapters", settings)  # type: ignore[arg-type]
    run = client.create_run(experiment)
    client.log_artifacts(run.info.run_id, str(folder), "adapter")
    client.set_terminated(run.info.run_id)
    if not client.search_registered_models(f"name='{name}'"):
        client.create_registered_model(name)
    version = client.create_model_version(name, source=f"{run.info.artifact_uri}/adapter",
                                          run_id=run.info.run_id)
    return str(version.version)


def test_versions_load_from_mlflow_by_number_and_alias_and_tampering_is_refused(
    make_server: ServerFactory, tiny_model: Path, adapters: list[Path], tmp_path: Path
) -> None:
    server = make_server(tiny_model, "tiny-llama")
    settings = server.app.state.service.settings
    assert register(settings, adapters[0]) == "1"
    client = mlflow_client(settings)
    client.set_registered_model_alias("policy", "champion", "1")
    # The service reads its own store, whatever this process's global MLflow registry is (a
    # separate serving process never sets it: the first real deployment found that).
    import mlflow

    mlflow.set_registry_uri(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    try:
        by_number = server.admin("POST", "/admin/adapters",
                                 json={"source": "models:/policy/1", "alias": "policy"})
        assert by_number.status_code == 201, by_number.text
        assert by_number.json()["name"] == "policy-v1"
        by_alias = server.admin("POST", "/admin/adapters", json={"source": "models:/policy@champion"})
        assert by_alias.status_code == 201 and by_alias.json()["name"] == "policy-v1"
    finally:
        mlflow_client(settings)  # points the process's registry back at the test's store
    answer = server.openai().completions.create(model="policy", prompt="hello", max_tokens=3)
    assert answer.model == "policy-v1"

    tampered = tmp_path / "tampered"
    shutil.copytree(adapters[1], tampered)
    weights = tampered / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert register(settings, tampered) == "2"
    refused = server.admin("POST", "/admin/adapters", json={"source": "models:/policy/2", "alias": "policy"})
    assert refused.status_code == 422 and "lineage manifest says" in refused.json()["error"]["message"]
    # Versions whose files lie elsewhere than the trainer's runs are not fetched: a source outside its
    # run's artifacts, no run at all, or a run whose artifacts lie outside the registry's store.
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(adapters[1], elsewhere)
    run = client.create_run(ensure_experiment(client, "adapters", settings))
    outside = client.create_model_version("policy", source=str(elsewhere), run_id=run.info.run_id)
    no_run = client.create_model_version("policy", source=str(elsewhere))
    foreign = client.create_experiment("foreign", artifact_location=str(tmp_path / "foreign"))
    foreign_run = client.create_run(foreign)
    client.log_artifacts(foreign_run.info.run_id, str(adapters[1]), "adapter")
    other_store = client.create_model_version("policy", source=f"{foreign_run.info.artifact_uri}/adapter",
                                              run_id=foreign_run.info.run_id)
    for version, reason in ((outside, "lies outside the artifacts of run"),
                            (no_run, "registered without a run"),
                            (other_store, "outside the registry's artifact store")):
        source = f"models:/policy/{version.version}"
        refused = server.admin("POST", "/admin/adapters", json={"source": source})
        assert refused.status_code == 422 and reason in refused.json()["error"]["message"], refused.text
    for version in (outside, no_run, other_store):  # refused before a byte was fetched
        folder = settings.adapters_dir / f"policy-v{version.version}"
        assert not [f for f in folder.rglob("*") if f.is_file()]
    missing = server.admin("POST", "/admin/adapters", json={"source": "models:/policy@nope"})
    assert missing.status_code == 422 and "no version of 'policy' with alias 'nope'" in missing.text
    assert server.admin("GET", "/admin/adapters").json()["aliases"] == {"policy": "policy-v1"}


def test_with_trusted_signers_only_versions_the_trainer_signed_are_loaded(
    make_server: ServerFactory, tiny_model: Path, adapters: list[Path], tmp_path: Path
) -> None:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from online_rl.registry import new_signing_key, write_lineage

    pem, trainer = new_signing_key()
    server = make_server(tiny_model, "tiny-llama", trusted_signers=(trainer,))
    settings = server.app.state.service.settings
    folders = {}
    for name, key in (("unsigned", None), ("forged", new_signing_key()[0]), ("trainer", pem)):
        folders[name] = shutil.copytree(adapters[0], tmp_path / name)
        signing = load_pem_private_key(key, password=None) if key else None
        write_lineage(folders[name], "tiny-llama", signing)  # type: ignore[arg-type]
    # registered by anyone who can reach MLflow, with hashes that match: still not served
    assert register(settings, folders["unsigned"]) == "1" and register(settings, folders["forged"]) == "2"
    for version, reason in (("1", "is not signed"), ("2", "not in mlflow.trusted_signers")):
        refused = server.admin("POST", "/admin/adapters", json={"source": f"models:/policy/{version}"})
        assert refused.status_code == 422 and reason in refused.json()["error"]["message"], refused.text
    assert register(settings, folders["trainer"]) == "3"
    loaded = server.admin("POST", "/admin/adapters", json={"source": "models:/policy/3"})
    assert loaded.status_code == 201, loaded.text
    assert [a["name"] for a in server.admin("GET", "/admin/adapters").json()["adapters"]] == ["policy-v3"]


def test_a_versions_files_leave_the_disk_when_it_is_unloaded_and_a_dead_replicas_are_swept(
    make_server: ServerFactory, tiny_model: Path, adapters: list[Path]
) -> None:
    """Each load keeps one copy on disk while the version is loaded; unloading deletes it, a refused
    load leaves nothing, and a replica that starts deletes the copies of a dead process on its host."""
    from online_rl.serving.adapters import OWNER_SUFFIX, AdapterManager

    server = make_server(tiny_model, "tiny-llama")
    settings = server.app.state.service.settings
    root = settings.adapters_dir

    def copies(name: str) -> list[Path]:
        return sorted(p for p in (root / name).glob("*") if p.is_dir())

    for adapter in adapters:
        register(settings, adapter)
    assert server.admin("POST", "/admin/adapters", json={"source": "models:/policy/1"}).status_code == 201
    assert server.admin("POST", "/admin/adapters", json={"source": "models:/policy/2"}).status_code == 201
    # loading a loaded version again fetches it, finds it loaded, and keeps one copy
    assert server.admin("POST", "/admin/adapters", json={"source": "models:/policy/1"}).status_code == 201
    assert len(copies("policy-v1")) == 1 and len(copies("policy-v2")) == 1
    assert any(f.name == "adapter_model.safetensors" for f in copies("policy-v1")[0].rglob("*"))
    assert server.admin("DELETE", "/admin/adapters/policy-v1").status_code == 204
    assert copies("policy-v1") == [] and not list((root / "policy-v1").glob(f"*{OWNER_SUFFIX}"))
    assert len(copies("policy-v2")) == 1  # still loaded, still on disk
    # a copy left by a process that is gone (SIGKILLed mid-download), and one of a live process
    for name, pid in (("gone", _exited_pid()), ("live", os.getpid())):
        folder = root / "policy-v9" / name
        (folder / "adapter").mkdir(parents=True)
        (folder / "adapter" / "adapter_model.safetensors").write_bytes(b"x" * 1024)
        folder.with_name(name + OWNER_SUFFIX).write_text(f"{socket.gethostname()} {pid}")
    manager = AdapterManager(server.app.state.service.core.engine, "tiny-llama", root)
    assert manager.swept == 1
    assert not (root / "policy-v9" / "gone").exists() and (root / "policy-v9" / "live").is_dir()
    assert len(copies("policy-v2")) == 1  # this live replica's loaded version is untouched


def _exited_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid
