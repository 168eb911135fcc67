"""`online-rl registry auth-config|grant`: MLflow's basic-auth app and the loop's users in it.

The chart's MLflow pod runs both: `auth-config` before the server starts (its init container), `grant` as
soon as it answers (its postStart hook). They also set up an MLflow server of your own (docs/deploy.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from online_rl.errors import ConfigError
from online_rl.registry.access import ADMIN, ROLES, Credentials, grant_access, write_auth_config

__all__ = ["registry_app"]

registry_app = typer.Typer(help="MLflow's basic-auth app: its config file, and each component's user and "
                                "rights on the model registry.", no_args_is_help=True)


@registry_app.command("auth-config")
def auth_config(
    out: Annotated[Path, typer.Argument(help="Where to write the config file (MLFLOW_AUTH_CONFIG_PATH).")],
    database_uri: Annotated[str, typer.Option(
        envvar="MLFLOW_AUTH_DATABASE_URI",
        help="The app's user database (sqlite:///..., postgresql://...; it may be the tracking store's).")],
) -> None:
    """Write the basic-auth app's config file (mode 0600): its user database, READ for any signed-in user,
    the admin's name. The admin's password is MLFLOW_AUTH_ADMIN_PASSWORD at the server's first start."""
    write_auth_config(out, database_uri)
    typer.echo(f"wrote {out}")


@registry_app.command("grant")
def grant(
    ctx: typer.Context,
    users: Annotated[Path, typer.Argument(
        help="A folder (a mounted Secret) with <role>-username and <role>-password for the roles trainer, "
             "gateway and inference; a role without them gets no user.")],
    tracking_uri: Annotated[str, typer.Option(help="The MLflow server.")] = "http://127.0.0.1:5000",
    registered_model: Annotated[str | None, typer.Option(
        help="The registered model (default: mlflow.registered_model of the settings).")] = None,
    wait: Annotated[float, typer.Option(min=0, help="Seconds the server may take to answer.")] = 0.0,
) -> None:
    """As MLflow's admin (MLFLOW_AUTH_ADMIN_USERNAME, default admin, and MLFLOW_AUTH_ADMIN_PASSWORD): each
    role's user with its password, the registered model, and each role's rights on it. Run it again at
    every start: it sets what is missing and the passwords given."""
    from online_rl.config import load_settings

    password = os.environ.get("MLFLOW_AUTH_ADMIN_PASSWORD")
    if not password:
        raise ConfigError("MLFLOW_AUTH_ADMIN_PASSWORD is empty: set it to the MLflow admin's password")
    admin = Credentials(os.environ.get("MLFLOW_AUTH_ADMIN_USERNAME") or ADMIN, password)
    found = {role: _read_user(users, role) for role in ROLES}
    given = {role: user for role, user in found.items() if user is not None}
    model = registered_model or load_settings(ctx.obj["config"]).mlflow.registered_model
    grant_access(tracking_uri, admin, given, model, wait_s=wait)
    missing = sorted(set(ROLES) - set(given))
    typer.echo(f"{tracking_uri}: users {', '.join(u.username for u in given.values()) or 'none'} have their "
               f"rights on {model}" + (f" (no files for {', '.join(missing)})" if missing else ""))


def _read_user(folder: Path, role: str) -> Credentials | None:
    files = [folder / f"{role}-username", folder / f"{role}-password"]
    present = [f.is_file() for f in files]
    if not any(present):
        return None
    if not all(present):
        raise ConfigError(f"{folder} has only one of {role}-username and {role}-password: give both")
    username, password = (f.read_text().strip() for f in files)
    if not username or len(password) < 12:
        raise ConfigError(f"{folder}: {role}-username is empty or {role}-password is shorter than 12 "
                          "characters (MLflow's minimum)")
    return Credentials(username, password)
