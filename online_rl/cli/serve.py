"""`online-rl keys new` and `online-rl serve ...`: API keys and the HTTP services."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from online_rl.cli.health import announce_health
from online_rl.config import load_settings
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
    from services.feedback.main import create_app

    settings = load_settings(ctx.obj["config"])
    api = settings.feedback_api
    _run(create_app(settings), host or api.host, port or api.port, api.max_concurrency)


@serve_app.command("inference")
def serve_inference(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Listen address (default: config).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: config).")] = None,
    engine: Annotated[str | None, typer.Option(help="auto, vllm or transformers (default: config).")] = None,
) -> None:
    """Serve the OpenAI-compatible inference API (POST /v1/chat/completions) until interrupted."""
    from services.inference.main import create_app

    settings = load_settings(ctx.obj["config"])
    if engine is not None:
        settings = settings.model_copy(update={"inference": settings.inference.model_copy(
            update={"engine": engine})})
    api = settings.inference
    _run(create_app(settings), host or api.host, port or api.port, api.max_concurrency)


@serve_app.command("gateway")
def serve_gateway(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Listen address (default: config).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: config).")] = None,
) -> None:
    """Serve the canary gateway (OpenAI pass-through + rollout control, page at /rollout/ui)."""
    from services.gateway.main import create_app

    settings = load_settings(ctx.obj["config"])
    api = settings.gateway
    _run(create_app(settings), host or api.host, port or api.port, api.max_concurrency)


def _run(app: Any, host: str, port: int, max_concurrency: int) -> None:
    from services.limits import serve

    announce_health(f"http://127.0.0.1:{port}/healthz")
    serve(app, host, port, max_concurrency)
