"""Who may do what in the registry, on MLflow's real server with its basic-auth app, started as `online-rl
up` starts it (the same command, environment and users; online_rl/launch/mlflow_auth.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from online_rl.config import Settings
from online_rl.errors import ConfigError
from online_rl.launch import plan
from online_rl.launch.mlflow_auth import make_registry_auth
from online_rl.ports import free_port
from online_rl.registry import (
    Credentials,
    RegistryAccessError,
    RegistryAuth,
    alias_version,
    download_version,
    grant_access,
    publish_adapter,
    use_credentials,
)
from online_rl.tracking import ensure_experiment, registry_artifact_roots

MODEL = "policy"


@dataclass(frozen=True)
class Registry:
    url: str
    auth: RegistryAuth
    settings: Settings
    run_dir: Path

    @contextlib.contextmanager
    def client(self, role: str | None) -> Iterator[MlflowClient]:
        """An MLflow client signed in as `role`'s user (None: nobody)."""
        saved = {k: os.environ.pop(k, None) for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
        try:
            with use_credentials(self.auth.users[role] if role else None):
                yield MlflowClient(self.url, registry_uri=self.url)
        finally:
            os.environ.update({k: v for k, v in saved.items() if v is not None})


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """MLflow as `up` runs it: the run's users made, the server started from the plan, the rights granted."""
    root, port = tmp_path_factory.mktemp("registry"), free_port()
    settings = Settings.model_validate({
        "cache_dir": str(root / "cache"),
        "mlflow": {"registered_model": MODEL, "tracking_uri": f"http://127.0.0.1:{port}"},
        "launch": {"run_dir": str(root / "run"), "mlflow_port": port, "bus": "embedded"}})
    run = settings.run_dir
    (run / "mlflow").mkdir(parents=True)
    auth = make_registry_auth(run)
    wiring, components = plan(settings, None, run / "api-keys.txt", "")
    (server,) = [c for c in components if c.name == "mlflow"]
    assert "basic-auth" in server.argv
    log = (root / "mlflow.log").open("wb")
    process = subprocess.Popen(server.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               env={**os.environ, **wiring.env, **server.env})
    try:
        grant_access(wiring.mlflow_url, auth.admin, auth.users, MODEL, wait_s=180)
        yield Registry(wiring.mlflow_url, auth, settings, run)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
        log.close()


def _refused(call: Callable[[], Any]) -> str:
    with pytest.raises(MlflowException) as refused:
        call()
    return str(refused.value.error_code)


def test_the_run_keeps_its_mlflow_users_to_its_owner(registry: Registry) -> None:
    for name in ("mlflow-auth.json", "mlflow/basic_auth.ini"):
        assert os.stat(registry.run_dir / name).st_mode & 0o077 == 0, name
    assert {u.username for u in registry.auth.users.values()} == {"trainer", "gateway", "inference"}
    assert make_registry_auth(registry.run_dir) == registry.auth  # kept across `up`s
    # each component that talks to MLflow signs in as its own user; feedback and the joiner never do
    components = {c.name: c for c in plan(registry.settings, None, registry.run_dir / "keys", "")[1]}
    for name, component in components.items():
        user = component.env.get("MLFLOW_TRACKING_USERNAME")
        assert user == (name if name in ("inference", "trainer", "gateway") else None), name
        if user:
            assert component.env["MLFLOW_TRACKING_PASSWORD"] == registry.auth.users[user].password
    assert components["mlflow"].env["MLFLOW_AUTH_ADMIN_PASSWORD"] == registry.auth.admin.password


def test_each_identity_may_do_only_its_part(registry: Registry, adapters: list[Path], tmp_path: Path) -> None:
    url = f"{registry.url}/api/2.0/mlflow/registered-models/get"
    # Nobody unnamed gets in (only /health is open), and a wrong password is nobody.
    assert httpx.get(f"{registry.url}/health", timeout=10).status_code == 200
    assert httpx.get(url, params={"name": MODEL}, timeout=10).status_code == 401
    assert httpx.get(url, params={"name": MODEL}, auth=("inference", "not-its-password"), timeout=10
                     ).status_code == 401
    with registry.client(None) as anonymous, pytest.raises(MlflowException, match="401"):
        anonymous.get_registered_model(MODEL)

    # The admin made the registered model before anyone else could claim it.
    with registry.client("inference") as reader:
        assert reader.get_registered_model(MODEL).name == MODEL
        assert _refused(lambda: reader.create_registered_model(MODEL)) == "RESOURCE_ALREADY_EXISTS"

    # The trainer logs its run, registers versions and points `challenger` at them (as it publishes).
    with registry.client("trainer") as trainer:
        experiment = ensure_experiment(trainer, "online-rl-trainer", registry.settings)
        run = trainer.create_run(experiment)
        first = publish_adapter(trainer, run.info.run_id, adapters[0], MODEL, "adapter-1")
        second = publish_adapter(trainer, run.info.run_id, adapters[1], MODEL, "adapter-2")
        assert alias_version(trainer, MODEL, "challenger") == second.version
        assert _refused(lambda: trainer.delete_model_version(MODEL, first.version)) == "PERMISSION_DENIED"
        assert _refused(lambda: trainer.delete_registered_model(MODEL)) == "PERMISSION_DENIED"

    # The gateway's rollout controller moves the aliases and tags versions; it deletes nothing.
    with registry.client("gateway") as gateway:
        gateway.set_registered_model_alias(MODEL, "champion", first.version)
        gateway.delete_registered_model_alias(MODEL, "challenger")
        gateway.set_model_version_tag(MODEL, first.version, "rollout.status", "promoted")
        assert _refused(lambda: gateway.delete_model_version(MODEL, second.version)) == "PERMISSION_DENIED"

    # Serving reads versions, aliases and their files, as an inference replica loads them ...
    with registry.client("inference") as reader:
        assert alias_version(reader, MODEL, "champion") == first.version
        assert reader.get_model_version(MODEL, first.version).tags["rollout.status"] == "promoted"
        folder = download_version(registry.url, MODEL, first.version, tmp_path / "v1",
                                  registry_artifact_roots(registry.settings))
        assert (folder / "adapter_model.safetensors").read_bytes() == (
            adapters[0] / "adapter_model.safetensors").read_bytes()
        # ... and is refused every write: no alias, no version, no deletion, no tag, not in the trainer's run
        for write in (lambda: reader.set_registered_model_alias(MODEL, "champion", second.version),
                      lambda: reader.delete_registered_model_alias(MODEL, "champion"),
                      lambda: reader.create_model_version(MODEL, first.source, run_id=run.info.run_id),
                      lambda: reader.delete_model_version(MODEL, first.version),
                      lambda: reader.set_model_version_tag(MODEL, first.version, "rollout.status", "x"),
                      lambda: reader.create_run(experiment)):
            assert _refused(write) == "PERMISSION_DENIED"
    auth = {"auth": ("inference", registry.auth.users["inference"].password), "timeout": 10}
    alias = f"{registry.url}/api/2.0/mlflow/registered-models/alias"
    assert httpx.post(alias, json={"name": MODEL, "alias": "champion", "version": second.version}, **auth
                      ).status_code == 403
    assert httpx.request("DELETE", f"{registry.url}/api/2.0/mlflow/model-versions/delete",
                         json={"name": MODEL, "version": first.version}, **auth).status_code == 403
    with registry.client("inference") as reader:
        assert alias_version(reader, MODEL, "champion") == first.version  # nothing moved
        assert len(reader.search_model_versions(f"name='{MODEL}'")) == 2  # nothing added or deleted


def test_granting_again_sets_each_right_back_and_a_wrong_admin_password_is_named(registry: Registry) -> None:
    # someone lowered the trainer's right on the model by hand: granting again sets it back in place
    admin = {"auth": (registry.auth.admin.username, registry.auth.admin.password), "timeout": 10}
    grant = {"username": "trainer", "resource_type": "registered_model", "resource_id": MODEL}
    assert httpx.post(f"{registry.url}/api/3.0/mlflow/users/permissions/revoke", json=grant, **admin
                      ).status_code == 200
    assert httpx.post(f"{registry.url}/api/3.0/mlflow/users/permissions/grant",
                      json={**grant, "permission": "READ"}, **admin).status_code == 200
    with registry.client("trainer") as trainer:
        assert _refused(lambda: trainer.set_registered_model_tag(MODEL, "k", "v")) == "PERMISSION_DENIED"
    grant_access(registry.url, registry.auth.admin, registry.auth.users, MODEL)
    grant_access(registry.url, registry.auth.admin, registry.auth.users, MODEL)  # and again: no change
    with registry.client("trainer") as trainer:
        trainer.set_registered_model_tag(MODEL, "k", "v")  # its right and its password still hold
    wrong = Credentials(registry.auth.admin.username, "not-the-admin-password")
    with pytest.raises(RegistryAccessError, match=r"refused its admin user 'admin'.*first start"):
        grant_access(registry.url, wrong, registry.auth.users, MODEL)


def test_a_run_folder_that_lost_its_passwords_gets_new_ones_and_a_new_user_database(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "mlflow").mkdir(parents=True)
    first = make_registry_auth(run)
    (run / "mlflow" / "basic_auth.db").write_bytes(b"made with the first passwords")
    (run / "mlflow-auth.json").unlink()
    second = make_registry_auth(run)
    assert second.admin.password != first.admin.password
    assert not (run / "mlflow" / "basic_auth.db").exists()


def test_the_charts_commands_write_the_config_and_grant_from_a_mounted_secret(
        registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from online_rl.cli.app import app

    runner = CliRunner()
    config = tmp_path / "auth" / "basic_auth.ini"
    wrote = runner.invoke(app, ["registry", "auth-config", str(config)],
                          env={"MLFLOW_AUTH_DATABASE_URI": "postgresql://u:p@db/mlflow"})
    assert wrote.exit_code == 0, wrote.output
    assert os.stat(config).st_mode & 0o777 == 0o600
    text = config.read_text()
    assert "default_permission = READ" in text and "database_uri = postgresql://u:p@db/mlflow" in text
    assert "admin_username = admin" in text and "password" not in text

    secret = tmp_path / "secret"  # as the chart mounts it: <role>-username, <role>-password
    secret.mkdir()
    for role, user in registry.auth.users.items():
        (secret / f"{role}-username").write_text(user.username)
        (secret / f"{role}-password").write_text(user.password)
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_USERNAME", raising=False)
    granted = runner.invoke(app, ["registry", "grant", str(secret), "--tracking-uri", registry.url,
                                  "--registered-model", MODEL],
                            env={"MLFLOW_AUTH_ADMIN_PASSWORD": registry.auth.admin.password})
    assert granted.exit_code == 0, granted.output
    assert "users trainer, gateway, inference have their rights on policy" in granted.output
    (secret / "gateway-password").unlink()
    half = runner.invoke(app, ["registry", "grant", str(secret), "--tracking-uri", registry.url,
                               "--registered-model", MODEL],
                         env={"MLFLOW_AUTH_ADMIN_PASSWORD": registry.auth.admin.password})
    assert isinstance(half.exception, ConfigError)
    assert "only one of gateway-username and gateway-password" in str(half.exception)
