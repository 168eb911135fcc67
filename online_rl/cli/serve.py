"""`online-rl keys new` and `online-rl serve ...`: API keys and the HTTP services."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import typer

from online_rl.config import Settings, load_settings
from online_rl.errors import ConfigError
from online_rl.ingest import check_subject, new_key

__all__ = ["keys_app", "serve_app"]

keys_app = typer.Typer(help="API keys (only their hashes are stored).", no_args_is_help=True)
serve_app = typer.Typer(help="Run an HTTP service in the foreground.", no_args_is_help=True)


@keys_app.command("new")
def keys_new(
    scopes: Annotated[str, typer.Option(
        help="Comma-separated scopes: 'feedback', 'inference', 'admin'; empty = all.")] = "",
    user: Annotated[str | None, typer.Option(
        help="Bind the key to this user id: it can chat and give feedback only as that user. Leave it "
             "out for a backend that names its users itself.")] = None,
) -> None:
    """Make an API key: give the key to the client, store the entry in the config or a Secret."""
    if user is not None:
        check_subject(user, "--user")
    raw, digest = new_key()
    entry = " ".join(part for part in (digest, scopes, f"user={user}" if user else "") if part)
    typer.echo(f"key:   {raw}")
    typer.echo(f"entry: {entry}")
    typer.echo("Put the entry in feedback_api.api_keys, inference.api_keys or gateway.api_keys (or an "
               "api_keys_file); the key is not stored anywhere.", err=True)


@keys_app.command("signing")
def keys_signing(
    out: Annotated[Path, typer.Argument(help="Where to write the private key (PEM, mode 0600); it must "
                                        "not exist.")],
) -> None:
    """Make the trainer's version-signing key: the private key goes to OUT (for the trainer's
    mlflow.signing_key_file), the public key is printed (for serving's mlflow.trusted_signers)."""
    from online_rl.registry import new_signing_key

    pem, public = new_signing_key()
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise ConfigError(f"{out} exists; give a new path (a signing key is never overwritten)") from exc
    except OSError as exc:
        raise ConfigError(f"cannot write {out}: {exc.strerror}") from exc
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    typer.echo(f"private: {out}")
    typer.echo(f"public:  {public}")
    typer.echo("Give the trainer mlflow.signing_key_file (from a Secret); list the public key in serving's "
               "mlflow.trusted_signers.", err=True)


@serve_app.command("feedback")
def serve_feedback(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Listen address (default: config).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: config).")] = None,
) -> None:
    """Serve the feedback REST API (POST /v1/feedback) until interrupted."""
    _serve("feedback", load_settings(ctx.obj["config"]), host, port)


@serve_app.command("inference")
def serve_inference(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Listen address (default: config).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: config).")] = None,
    engine: Annotated[str | None, typer.Option(help="auto, vllm or transformers (default: config).")] = None,
) -> None:
    """Serve the OpenAI-compatible inference API (POST /v1/chat/completions) until interrupted."""
    settings = load_settings(ctx.obj["config"])
    if engine is not None:
        settings = settings.model_copy(update={"inference": settings.inference.model_copy(
            update={"engine": engine})})
    _serve("inference", settings, host, port)


@serve_app.command("gateway")
def serve_gateway(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Listen address (default: config).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: config).")] = None,
) -> None:
    """Serve the canary gateway (OpenAI pass-through + rollout control, page at /rollout/ui)."""
    _serve("gateway", load_settings(ctx.obj["config"]), host, port)


def _serve(name: Literal["feedback", "inference", "gateway"], settings: Settings, host: str | None,
           port: int | None) -> None:
    # The library's one door into the apps (it never imports FastAPI): `services.common.serve`
    # builds the app, announces its health URL and serves it, as `python -m services.<name>` does.
    from services.common.serve import serve_named

    serve_named(name, settings, host, port)
