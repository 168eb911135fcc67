"""Who may do what in the model registry: MLflow's basic-auth app, the loop's users and their grants.

MLflow's basic-auth app (`mlflow server --app-name basic-auth`) asks every request except `/health` for a
user and a password (401 without them) and checks each call against that user's grants (403). This
module writes the app's config file and, as MLflow's admin, gives each component a user of its own:

- trainer: creates its runs and logs their artifacts, registers versions and points `challenger` at them.
  EDIT on every experiment, MANAGE on the registered model.
- gateway: its rollout controller moves `champion` and `challenger` and tags versions with its verdicts.
  MANAGE on the registered model.
- inference: reads versions, aliases and their files (the demo's report reads with it too). No grant:
  the default permission, READ.

Both writers also get EDIT on the versions, so that neither can delete a version (nor the model, which
would delete them all): only the admin can. The admin creates the registered model before any component
runs, because whoever creates it is given MANAGE on it. MLflow asks the same right (`update` on the
model) to set an alias and to register a version, so the gateway could register one too; serving loads
only versions the trainer signed (`online_rl.registry.lineage`).

Talks to MLflow's REST API with httpx; knows nothing about what the components do with their rights.
"""

from __future__ import annotations

import configparser
import contextlib
import os
import re
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from online_rl.errors import ConfigError
from online_rl.registry.errors import RegistryAccessError

__all__ = ["ADMIN", "AUTH_CACHE_TTL_S", "DEFAULT_PERMISSION", "GRANTS", "MODEL", "ROLES", "Credentials",
           "RegistryAuth", "grant_access", "use_credentials", "write_auth_config"]

ADMIN = "admin"  # the app's admin user (`admin_username`), made at the server's first start
DEFAULT_PERMISSION = "READ"  # what any signed-in user may do without a grant: read
AUTH_CACHE_TTL_S = 300  # how long the server remembers a password that checked out
MODEL = "<registered model>"  # stands for `mlflow.registered_model` in GRANTS

# Each role's grants: (resource type, resource id or "*", permission), as MLflow's grant API takes them.
GRANTS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "trainer": (("experiment", "*", "EDIT"), ("registered_model", MODEL, "MANAGE"),
                ("registered_model_version", "*", "EDIT")),
    "gateway": (("registered_model", MODEL, "MANAGE"), ("registered_model_version", "*", "EDIT")),
    "inference": (),
}
ROLES = tuple(GRANTS)

# MLflow's REST API (mlflow/server/auth/routes.py and the registry's).
_HEALTH = "/health"
_GET_USER = "/api/2.0/mlflow/users/get"
_CREATE_USER = "/api/2.0/mlflow/users/create"
_UPDATE_PASSWORD = "/api/2.0/mlflow/users/update-password"
_GRANT = "/api/3.0/mlflow/users/permissions/grant"
_USER_ROLES = "/api/3.0/mlflow/users/roles/list"
_UPDATE_GRANT = "/api/3.0/mlflow/roles/permissions/update"
_OWN_ROLE = re.compile(r"^__user_\d+__$")  # the user's own role, where MLflow keeps its grants
_CREATE_MODEL = "/api/2.0/mlflow/registered-models/create"


@dataclass(frozen=True)
class Credentials:
    """A user of MLflow's basic-auth app. MLflow's clients read them from the environment."""

    username: str
    password: str = field(repr=False)

    def env(self) -> dict[str, str]:
        return {"MLFLOW_TRACKING_USERNAME": self.username, "MLFLOW_TRACKING_PASSWORD": self.password}


@dataclass(frozen=True)
class RegistryAuth:
    """Everything a basic-auth MLflow server of the loop needs: its admin, each role's user and the app's
    static secret key (MLFLOW_FLASK_SERVER_SECRET_KEY, for its CSRF tokens)."""

    admin: Credentials
    users: dict[str, Credentials]
    secret_key: str = field(repr=False)

    @classmethod
    def generate(cls) -> RegistryAuth:
        """New random passwords (256 bits each); each role's user is named after the role."""
        return cls(Credentials(ADMIN, secrets.token_urlsafe(32)),
                   {role: Credentials(role, secrets.token_urlsafe(32)) for role in ROLES},
                   secrets.token_urlsafe(32))

    def as_dict(self) -> dict[str, Any]:
        return {"admin": vars(self.admin), "users": {role: vars(c) for role, c in self.users.items()},
                "secret_key": self.secret_key}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RegistryAuth:
        users = {role: Credentials(**c) for role, c in data["users"].items()}
        return cls(Credentials(**data["admin"]), users, str(data["secret_key"]))


def write_auth_config(path: Path, database_uri: str) -> None:
    """The basic-auth app's config file (the server reads it from MLFLOW_AUTH_CONFIG_PATH), mode 0600:
    its user database, the default permission (READ), the admin's name and how long a checked password
    is remembered. The admin's password is MLFLOW_AUTH_ADMIN_PASSWORD in the server's environment; it
    counts only at the server's first start."""
    config = configparser.ConfigParser(interpolation=None)
    config["mlflow"] = {
        "default_permission": DEFAULT_PERMISSION,
        "database_uri": database_uri,
        "admin_username": ADMIN,
        "authorization_function": "mlflow.server.auth:authenticate_request_basic_auth",
        # A password check costs a PBKDF2 hash (about 1.5 s on a busy 2-core machine): every request would
        # pay it. A good one is remembered this long, per server process; a password changed through
        # MLflow's API is forgotten at once on the process that changed it, on the others within this time.
        "auth_cache_ttl_seconds": str(AUTH_CACHE_TTL_S),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        config.write(handle)
    os.replace(tmp, path)


def grant_access(tracking_uri: str, admin: Credentials, users: Mapping[str, Credentials],
                 registered_model: str, wait_s: float = 0.0) -> None:
    """As the admin: each role's user with its password (created, or its password set again), the
    registered model (created when new) and each role's grants (`GRANTS`). Idempotent: run it at every
    start, before the components. `wait_s`: how long the server may take to answer its health check."""
    unknown = sorted(set(users) - set(GRANTS))
    if unknown:
        raise ConfigError(f"no MLflow role named {', '.join(unknown)}; the roles are {', '.join(ROLES)}")
    with httpx.Client(base_url=tracking_uri.rstrip("/"), auth=(admin.username, admin.password),
                      timeout=30.0) as http:
        _wait_healthy(http, wait_s)
        _call(http, "GET", _GET_USER, params={"username": admin.username})  # the admin signs in
        for user in users.values():
            _ensure_user(http, user)
        _call(http, "POST", _CREATE_MODEL, json={"name": registered_model}, exists_ok=True)
        for role, user in users.items():
            for resource_type, resource_id, permission in GRANTS[role]:
                _grant(http, user.username, resource_type,
                       registered_model if resource_id == MODEL else resource_id, permission)


@contextlib.contextmanager
def use_credentials(credentials: Credentials | None) -> Iterator[None]:
    """MLflow's clients in this process sign in as `credentials` inside the block (None: as before).
    MLflow reads them from the environment at each request, so the block must not overlap another
    thread's MLflow calls that sign in as someone else."""
    if credentials is None:
        yield
        return
    saved = {name: os.environ.get(name) for name in credentials.env()}
    os.environ.update(credentials.env())
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _wait_healthy(http: httpx.Client, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if http.get(_HEALTH).status_code == 200:
                return
            problem = "its health check failed"
        except httpx.HTTPError as exc:
            problem = f"it does not answer ({exc})"
        if time.monotonic() >= deadline:
            raise RegistryAccessError(f"cannot set up MLflow's users at {http.base_url}: {problem}")
        time.sleep(1.0)


def _ensure_user(http: httpx.Client, user: Credentials) -> None:
    body = {"username": user.username, "password": user.password}
    if _call(http, "POST", _CREATE_USER, json=body, exists_ok=True).get("exists"):
        _call(http, "PATCH", _UPDATE_PASSWORD, json=body)  # the password given now is the one that counts


def _grant(http: httpx.Client, username: str, resource_type: str, resource_id: str, permission: str) -> None:
    """`permission` on the resource for the user, whether it had another grant there or none. MLflow's
    grant call does not overwrite, so a grant already there is set in place (never revoked, not even for
    a moment: another replica may be serving)."""
    body = {"username": username, "resource_type": resource_type, "resource_id": resource_id,
            "permission": permission}
    if not _call(http, "POST", _GRANT, json=body, exists_ok=True).get("exists"):
        return
    roles = _call(http, "GET", _USER_ROLES, params={"username": username}).get("roles", [])
    for role in roles:
        for grant in role.get("permissions", []) if _OWN_ROLE.match(role.get("name", "")) else []:
            there = (grant["resource_type"], grant["resource_pattern"]) == (resource_type, resource_id)
            if there and grant["permission"] != permission:
                _call(http, "PATCH", _UPDATE_GRANT, json={"role_permission_id": grant["id"],
                                                          "permission": permission})


def _call(http: httpx.Client, method: str, path: str, exists_ok: bool = False,
          **kwargs: Any) -> dict[str, Any]:
    """One admin call and its answer; {"exists": True} when it creates something that is already there
    and `exists_ok`."""
    try:
        response = http.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise RegistryAccessError(f"MLflow at {http.base_url} did not answer {method} {path}: {exc}") from exc
    if response.status_code == 200:
        with contextlib.suppress(ValueError):
            answer = response.json()
            return answer if isinstance(answer, dict) else {}
        return {}
    if response.status_code == 401:
        raise RegistryAccessError(
            f"MLflow at {http.base_url} refused its admin user {ADMIN!r}: the password is not the one its "
            "user database was created with (the admin password counts only at the server's first start). "
            "Set the first one back, or change it with MLflow's users/update-password API (docs/deploy.md)")
    with contextlib.suppress(ValueError):
        if exists_ok and response.json().get("error_code") == "RESOURCE_ALREADY_EXISTS":
            return {"exists": True}
    raise RegistryAccessError(f"MLflow at {http.base_url} refused {method} {path} "
                              f"({response.status_code}): {response.text[:300]}")
