"""`online-rl hybrid`: colocated PPO on fresh rollouts, driven by the live stream (until a signal)."""

from __future__ import annotations

from typing import Annotated

import typer

from online_rl.bus import ensure_topics, open_bus
from online_rl.cli.signals import stop_on_signals
from online_rl.config import load_settings

__all__ = ["hybrid_cmd"]


def hybrid_cmd(
    ctx: typer.Context,
    max_steps: Annotated[int | None, typer.Option(help="Stop after this many PPO iterations.")] = None,
) -> None:
    """PPO on the HybridEngine: sample completions for recent prompts, score them with a reward model
    that learns from the stream's preference pairs, update the LoRA policy; publish versions to MLflow.

    The layouts and the loop are the `hybrid.*` settings (`online-rl config` lists them). This is the
    trainer's rollout flow (`online-rl trainer` with `trainer.flow: rollout`).
    """
    from online_rl.hybrid.runner import run_hybrid
    from online_rl.ray_runtime import init_ray

    settings = load_settings(ctx.obj["config"])
    init_ray(settings)  # before our handlers: Ray installs its own
    bus = open_bus(settings)
    ensure_topics(bus, settings.topics, settings.bus.partitions)
    stop = stop_on_signals("the current iteration")
    try:
        state = run_hybrid(settings, bus, max_steps=max_steps, stop=stop)
    finally:
        bus.close()
    published = ", ".join(v.serving_name for v in state.published) or "none"
    typer.echo(f"hybrid: {state.steps} iteration(s) on {state.samples} sample(s) ({state.pairs} pairs); "
               f"published: {published}")
