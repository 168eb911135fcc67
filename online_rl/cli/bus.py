"""`online-rl bus ...` and `online-rl join`: topic admin, inspection, and the joiner process."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from online_rl.bus import ensure_topics, open_bus
from online_rl.cli.health import Heartbeat
from online_rl.cli.signals import stop_on_signals
from online_rl.config import load_settings
from online_rl.errors import DecodeError
from online_rl.events import Feedback, Interaction, TrainingSample, decode

__all__ = ["bus_app", "join_cmd"]

bus_app = typer.Typer(help="Topics of the event bus (Kafka or the embedded log).", no_args_is_help=True)
logger = logging.getLogger(__name__)


@bus_app.command("create-topics")
def create_topics(
    ctx: typer.Context,
    partitions: Annotated[int | None, typer.Option(min=1, help="Partitions (default: config).")] = None,
) -> None:
    """Create every topic of the contract (existing ones are left as they are)."""
    settings = load_settings(ctx.obj["config"])
    bus = open_bus(settings)
    topics = settings.topics
    ensure_topics(bus, topics, partitions or settings.bus.partitions)
    for name in (topics.interactions, topics.feedback, topics.samples, topics.dlq, topics.join_state,
                 topics.join_pairs):
        typer.echo(f"{name}: {bus.partitions(name)} partitions")
    bus.close()


@bus_app.command("tail")
def tail(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name, e.g. orl.samples.")],
    count: Annotated[int, typer.Option(min=1, help="Show at most this many (the newest).")] = 10,
) -> None:
    """Print the newest records of a topic, decoded when they are events."""
    settings = load_settings(ctx.obj["config"])
    bus = open_bus(settings)
    records = list(bus.read_all(topic))[-count:]
    for record in records:
        value = record.value or b""
        text = None
        for kind in (Interaction, Feedback, TrainingSample):
            try:
                text = decode(value, kind).model_dump_json()
                break
            except DecodeError:
                continue
        headers = {k: v.decode(errors="replace") for k, v in record.headers}
        shown = text or ("(tombstone)" if record.value is None else repr(value[:200]))
        typer.echo(f"{record.topic}[{record.partition}]@{record.offset} {headers or ''} {shown}")
    bus.close()


def join_cmd(
    ctx: typer.Context,
    window: Annotated[
        float | None, typer.Option(help="Reward wait window, seconds (default: config).")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="Serve Prometheus metrics on this port (/metrics).")
    ] = None,
) -> None:
    """Run the feedback joiner until SIGTERM/SIGINT: interactions ⋈ feedback -> training samples."""
    from online_rl.stream import JoinConfig, Joiner

    settings = load_settings(ctx.obj["config"])
    bus = open_bus(settings)
    topics = settings.topics
    ensure_topics(bus, topics, settings.bus.partitions)
    join = settings.join
    config = JoinConfig(
        window_s=window or join.window_s,
        aggregation=join.aggregation,
        default_reward=join.default_reward,
        retention_s=max(join.retention_s, window or join.window_s),
        max_clock_skew_s=join.max_clock_skew_s,
        max_feedback_per_request=join.max_feedback_per_request,
    )
    joiner = Joiner(bus, config, topics=topics, group_id=join.group_id,
                    transactional_id=f"{join.group_id}-{join.instance}")
    if metrics_port:
        from prometheus_client import start_http_server

        from online_rl.stream.metrics import joiner_registry

        start_http_server(metrics_port, registry=joiner_registry(joiner))
    stop = stop_on_signals("the current step")
    heartbeat = Heartbeat()  # for a liveness probe: the loop goes round at least every poll timeout
    logger.info("joiner %s running on %s (window %.1fs)", join.instance, type(bus).__name__, config.window_s)

    def done() -> bool:
        heartbeat.beat()
        return stop.is_set()

    joiner.run(done)
    joiner.close()
    bus.close()
    typer.echo(f"joiner stopped: {dict(joiner.stats)}")
