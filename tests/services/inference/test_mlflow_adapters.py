"""Loading adapter versions from a real MLflow registry by version and by alias."""

from __future__ import annotations

import shutil
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
    missing = server.admin("POST", "/admin/adapters", json={"source": "models:/policy@nope"})
    assert missing.status_code == 422 and "no version of 'policy' with alias 'nope'" in missing.text
    assert server.admin("GET", "/admin/adapters").json()["aliases"] == {"policy": "policy-v1"}
