"""The run's MLflow users: `online-rl up` starts MLflow with its basic-auth app and gives each component a
user of its own (who may do what: online_rl/registry/access.py).

`<run>/mlflow-auth.json` (mode 0600, like keys.json) holds the admin's and each role's password and the
app's secret key (the server gets them in its environment); `<run>/mlflow/basic_auth.ini` (0600) is the
app's config, with its user database beside it (`basic_auth.db`). They are made once and kept across
`up`s, like the versions in the run's MLflow store; a run folder without the passwords gets new ones and
a new user database.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from online_rl.errors import EnvironmentProblem
from online_rl.registry.access import Credentials, RegistryAuth, write_auth_config

__all__ = ["AUTH_FILE", "component_credentials", "make_registry_auth", "read_registry_auth", "server_env"]

AUTH_FILE = "mlflow-auth.json"
_CONFIG, _DATABASE = Path("mlflow") / "basic_auth.ini", Path("mlflow") / "basic_auth.db"


def read_registry_auth(run: Path) -> RegistryAuth | None:
    """The run's MLflow users, or None when `up` has not made them (yet)."""
    try:
        data = json.loads((run / AUTH_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise EnvironmentProblem(f"cannot read {run / AUTH_FILE} ({exc}); delete it (a new one is made, "
                                 "with a new MLflow user database)") from exc
    try:
        return RegistryAuth.from_dict(data)
    except (KeyError, TypeError) as exc:
        raise EnvironmentProblem(f"{run / AUTH_FILE} is not what `online-rl up` wrote ({exc!r}); delete it "
                                 "(a new one is made, with a new MLflow user database)") from exc


def make_registry_auth(run: Path) -> RegistryAuth:
    """The run's MLflow users, made on the first `up` (with the app's config file)."""
    existing = read_registry_auth(run)
    if existing is not None and (run / _CONFIG).is_file():
        return existing
    auth = existing or RegistryAuth.generate()
    if existing is None:
        # a user database made with other passwords would refuse the new admin
        (run / _DATABASE).unlink(missing_ok=True)
        tmp = run / f".{AUTH_FILE}.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(auth.as_dict(), handle, indent=2)
        os.replace(tmp, run / AUTH_FILE)
    write_auth_config(run / _CONFIG, f"sqlite:///{run / _DATABASE}")
    return auth


def server_env(run: Path, auth: RegistryAuth | None) -> dict[str, str]:
    """What `mlflow server --app-name basic-auth` reads from its environment (set whatever the shell has).
    Without the run's users (`auth` None) the app refuses to start: it needs the secret key."""
    env = {"MLFLOW_AUTH_CONFIG_PATH": str(run / _CONFIG)}
    if auth is not None:
        env |= {"MLFLOW_AUTH_ADMIN_USERNAME": auth.admin.username,
                "MLFLOW_AUTH_ADMIN_PASSWORD": auth.admin.password,
                "MLFLOW_FLASK_SERVER_SECRET_KEY": auth.secret_key}
    return env


def component_credentials(auth: RegistryAuth | None, role: str) -> dict[str, str]:
    """A component's MLflow user as environment variables (none without the run's users)."""
    user: Credentials | None = auth.users.get(role) if auth is not None else None
    return user.env() if user is not None else {}
