"""`online-rl up`, `down` and `status`: the whole loop as local processes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from online_rl.config import load_settings

__all__ = ["demo_cmd", "down_cmd", "status_cmd", "supervise_cmd", "up_cmd"]


def up_cmd(
    ctx: typer.Context,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="Start from an empty run folder: no versions, samples, checkpoints or rollouts.",
        ),
    ] = False,
) -> None:
    """Start the bus, the MLflow server, an inference replica, the feedback API, the joiner, the trainer
    and the gateway as local processes; each must answer its health check before the next starts."""
    from online_rl.launch import read_keys, up

    config: Path | None = ctx.obj["config"]
    settings = load_settings(config)
    up(settings, config, fresh=fresh, echo=typer.echo)
    keys = read_keys(settings.run_dir)
    _show(settings)
    typer.echo(
        f"\nKeys (also in {settings.run_dir / 'keys.json'}):\n"
        f"  user  (feedback, inference): {keys.user}\n  admin (every scope):          {keys.admin}"
    )
    typer.echo("Stop everything with: online-rl down")


def down_cmd(ctx: typer.Context) -> None:
    """Stop every component `online-rl up` started (newest first; SIGTERM, then SIGKILL)."""
    from online_rl.launch import down

    stopped = down(load_settings(ctx.obj["config"]), echo=typer.echo)
    typer.echo(f"stopped {len(stopped)} component(s)" if stopped else "nothing was running")


def supervise_cmd(ctx: typer.Context) -> None:
    """The run's watchdog (started by `up`, stopped by `down`): restarts components that exit."""
    from online_rl.cli.signals import stop_on_signals
    from online_rl.launch.watchdog import Watchdog

    config: Path | None = ctx.obj["config"]
    watchdog = Watchdog(load_settings(config), config)
    watchdog.run_until(stop_on_signals("the current pass"))


def status_cmd(ctx: typer.Context) -> None:
    """Each component's state (ready, running, exited, stopped), its URL and its log."""
    settings = load_settings(ctx.obj["config"])
    if not _show(settings):
        raise typer.Exit(3)


def _show(settings: object) -> bool:
    from online_rl.config import Settings
    from online_rl.launch import status, watchdog_alive

    assert isinstance(settings, Settings)
    wiring, components = status(settings)
    console = Console()
    if wiring is None:
        console.print(f"no run in {settings.run_dir} (start one with `online-rl up`)")
        return False
    table = Table("component", "state", "restarts", "pid", "url", "log")
    run = settings.run_dir
    for c in components:
        colour = {"ready": "green", "running": "yellow", "restarting": "yellow"}.get(c.state, "red")
        log = c.log or "-"
        if log.startswith(f"{run}/"):
            log = log[len(str(run)) + 1 :]
        table.add_row(c.name, f"[{colour}]{c.state}[/]", str(c.restarts), str(c.pid or "-"), c.url or "-",
                      log)
    console.print(table)
    for c in components:
        if c.problem:
            console.print(f"[red]{c.name} failed:[/] {c.problem}", highlight=False)
    watching = watchdog_alive(settings)
    console.print("watchdog: " + ("restarting components that exit (logs/watchdog.log)" if watching
                                  else "not running (components that exit stay down)"))
    console.print(f"run folder: {run} (logs under it)")
    console.print(f"bus: {wiring['bus']}" + (f" at {wiring['bootstrap']}" if wiring.get("bootstrap") else ""))
    console.print(f"MLflow UI:    {wiring['mlflow_url']} (sign in as `inference`, read-only; its password is "
                  f"in {run / 'mlflow-auth.json'})", highlight=False)
    console.print(f"Rollout page: {wiring['gateway_url']}/rollout/ui (the admin key opens it)")
    return all(c.state == "ready" for c in components)


def demo_cmd(
    ctx: typer.Context,
    out: Annotated[
        Path, typer.Option(help="Where the report goes (report.md, report.json, reward.png).")
    ] = Path("demo-report"),
    preference: Annotated[
        str, typer.Option(help="What the simulated users like (see `online-rl simulate`).")
    ] = ("length:12"),
    kind: Annotated[str, typer.Option(help="thumbs (KTO) or rating (PPO).")] = "thumbs",
    users: Annotated[int, typer.Option(min=1, help="Distinct simulated users.")] = 100,
    silent: Annotated[float, typer.Option(min=0, max=1, help="Share of users who never answer.")] = 0.1,
    noise: Annotated[float, typer.Option(min=0, max=1, help="Chance a thumb is flipped.")] = 0.1,
    budget: Annotated[float, typer.Option(min=10, help="Seconds of simulated traffic at most.")] = 1200,
    promotions: Annotated[int, typer.Option(min=1, help="Promotions through the canary to wait for.")] = 2,
    measure: Annotated[
        int,
        typer.Option(
            min=1,
            help=(
                "Stop once the last promoted version has this many answers with feedback since its promotion."
            ),
        ),
    ] = 150,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight.")] = 8,
    max_tokens: Annotated[int, typer.Option(min=1, help="max_tokens of each request.")] = 48,
    seed: Annotated[int, typer.Option(help="Seed of the users' choices and noise.")] = 0,
) -> None:
    """Simulated users on the running loop (`online-rl up`) until versions are promoted through the canary
    and measured, then the report: reward per version over time, MLflow versions, decisions, freshness."""
    from online_rl.demo import DemoOptions, run_demo

    settings = load_settings(ctx.obj["config"])
    options = DemoOptions(preference=preference, kind=kind, users=users, silent=silent, noise=noise,
                          budget_s=budget, measure=measure, concurrency=concurrency, max_tokens=max_tokens,
                          seed=seed, promotions=promotions)
    report = run_demo(settings, out, options, echo=typer.echo)
    fmt = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
    fmt_int = lambda v: "—" if v is None else str(v)  # noqa: E731
    typer.echo(
        f"\nbase model's reward {fmt(report['base_reward'])} -> after the last promotion "
        f"{fmt(report['final_reward'])} (gain {fmt(report['reward_gain'])}); promoted: "
        f"{', '.join(report['promoted_versions']) or 'none'}; freshness {report['freshness_s']} s; "
        f"general ability {fmt_int(report['ability']['final'])}/{report['ability']['asked']} "
        f"(base {report['ability']['base']})"
    )
    typer.echo(f"report: {out / 'report.md'} (picture: {out / 'reward.png'}, figures: {out / 'report.json'})")
    for exited in report["exited"]:
        typer.echo(f"{exited['name']} exited during the run ({exited['restarts']} restart(s)"
                   f"{'; the watchdog gave up on it' if exited['failed'] else ''}); see the report")
    if not report["promoted_versions"]:
        rolled = "; ".join(f"{verdict}: {', '.join(v)}" for verdict, v in report["rollbacks"].items())
        typer.echo(f"demo failed: no version was promoted within the budget of {budget:.0f}s (rolled back: "
                   f"{rolled or 'none'}; versions published: {len(report['mlflow_versions'])})", err=True)
        raise typer.Exit(1)
