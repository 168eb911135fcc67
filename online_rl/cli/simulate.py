"""`online-rl simulate`: a population of simulated users chatting through the gateway and posting
feedback by a declared preference (see online_rl/simulate)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from online_rl.cli.errors import SimulationRefused
from online_rl.config import load_settings

__all__ = ["simulate_cmd"]


def simulate_cmd(
    ctx: typer.Context,
    preference: Annotated[str, typer.Option(
        help="What users like: phrase:<text>, length:<words>, format:<regex> or module:attribute."
    )] = "length:12",
    kind: Annotated[str, typer.Option(help="Feedback kind: thumbs, rating or pairwise.")] = "thumbs",
    requests: Annotated[int, typer.Option(help="Requests to send.")] = 200,
    users: Annotated[int, typer.Option(help="Distinct user ids.")] = 50,
    silent: Annotated[float, typer.Option(help="Share of users who never give feedback.")] = 0.2,
    noise: Annotated[float, typer.Option(help="Chance a thumb or choice is flipped.")] = 0.1,
    concurrency: Annotated[int, typer.Option(help="Requests in flight.")] = 4,
    max_tokens: Annotated[int, typer.Option(help="max_tokens of each request.")] = 32,
    temperature: Annotated[float, typer.Option(help="Sampling temperature of each request.")] = 0.7,
    prompts: Annotated[Path | None, typer.Option(help="A text file of prompts, one per line.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the users' choices and noise.")] = 0,
    gateway: Annotated[str | None, typer.Option(help="Gateway base URL (default: the config's).")] = None,
    feedback: Annotated[str | None, typer.Option(help="Feedback API URL (default: the config's).")] = None,
    key: Annotated[str | None, typer.Option(envvar="ORL_SIM_KEY", help=(
        "An API key with the inference and feedback scopes (or $ORL_SIM_KEY)."))] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Simulate users: prompts through the gateway, feedback by PREFERENCE to the feedback API."""
    from online_rl.simulate import PROMPTS, Population, load_preference, simulate

    settings = load_settings(ctx.obj["config"])
    if not key:
        raise SimulationRefused("no API key: pass --key or set ORL_SIM_KEY (`online-rl keys new --scopes "
                                "feedback,inference`; its entry in gateway.api_keys and "
                                "feedback_api.api_keys)")
    if kind not in ("thumbs", "rating", "pairwise"):
        raise SimulationRefused(f"--kind {kind!r}: use thumbs, rating or pairwise")
    lines = PROMPTS
    if prompts is not None:
        try:
            lines = tuple(line.strip() for line in prompts.read_text().splitlines() if line.strip())
        except OSError as exc:
            raise SimulationRefused(f"--prompts {prompts}: {exc.strerror}") from exc
    try:
        population = Population(load_preference(preference), users, silent, noise, kind, seed)  # type: ignore[arg-type]
    except ValueError as exc:
        raise SimulationRefused(str(exc)) from exc
    gateway_url = gateway or f"http://{settings.gateway.host}:{settings.gateway.port}"
    feedback_url = feedback or f"http://{settings.feedback_api.host}:{settings.feedback_api.port}"
    with Progress(transient=True, disable=as_json) as bar:
        task = bar.add_task(f"{users} users, {population.preference.name}", total=requests)
        result = simulate(gateway_url, feedback_url, key, population, requests, lines, concurrency,
                          max_tokens, temperature, progress=lambda n: bar.advance(task, n))
    if as_json:
        typer.echo(json.dumps(result.as_dict()))
        return
    table = Table("version", "answers", "mean preference score", "feedback sent")
    for version, served in sorted(result.versions.items()):
        score = "—" if served.mean_score is None else f"{served.mean_score:.3f}"
        table.add_row(version, str(served.answers), score, str(served.feedback))
    Console().print(table)
    if result.failed:
        typer.echo(f"{result.failed} of {result.requests} requests failed", err=True)
