"""`online-rl trainer`: the long-running trainer, until SIGTERM/SIGINT (or a step budget)."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from online_rl.bus import ensure_topics, open_bus
from online_rl.cli.health import announce_health
from online_rl.cli.signals import stop_on_signals
from online_rl.config import load_settings

__all__ = ["trainer_cmd"]

logger = logging.getLogger(__name__)


def trainer_cmd(
    ctx: typer.Context,
    max_steps: Annotated[
        int | None, typer.Option(help="Stop after this many steps (default: never).")
    ] = None,
    idle_exit: Annotated[
        float | None, typer.Option(help="Stop once the stream has been empty this many seconds.")
    ] = None,
    metrics_port: Annotated[
        int, typer.Option(help="Serve Prometheus metrics on this port (0: do not serve).")
    ] = 9400,
) -> None:
    """Train on the samples stream; checkpoint, commit and publish versions to MLflow as it goes.

    `trainer.flow` chooses what runs on every batch: feedback (DPO/KTO/PPO on users' samples), rollout
    (the hybrid engine on fresh rollouts, as `online-rl hybrid`) or 'package.module:function'.

    SIGTERM or SIGINT finish the current step (its checkpoint and commit) and exit cleanly.
    """
    from online_rl.ray_runtime import init_ray
    from online_rl.trainer import Trainer

    settings = load_settings(ctx.obj["config"])
    init_ray(settings)  # first: Ray installs its own SIGTERM handler, which ours must replace
    bus = open_bus(settings)
    ensure_topics(bus, settings.topics, settings.bus.partitions)
    stop = stop_on_signals("the current step")
    trainer = Trainer(settings, bus)
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, registry=trainer.metrics.registry)
        announce_health(f"http://127.0.0.1:{metrics_port}/metrics")
        logger.info("metrics on http://0.0.0.0:%d/metrics", metrics_port)
    state = trainer.run(max_steps=max_steps, stop=stop, idle_exit_s=idle_exit)
    bus.close()
    if trainer.kind == "rollout":
        published = ", ".join(v.serving_name for v in state.published) or "none"
        typer.echo(f"rollout flow: {state.steps} iteration(s) on {state.samples} sample(s) ({state.pairs} "
                   f"pairs); published: {published}")
        return
    published = ", ".join(v.serving_name for v in trainer.published) or "none"
    typer.echo(f"trained {state.samples} samples in {state.step} steps; dead-lettered {state.dead_lettered}; "
               f"published this run: {published}")
