"""`online-rl rollout ...`: the gateway's rollout control API from the command line.

status, history, start, pause, resume, weight, promote, rollback — each one authenticated call to
the gateway (`--url`, default the configured gateway address; `--key` or `$ORL_ADMIN_KEY`, a key
with the `admin` scope). The gateway's answer is printed (`--json`: as it came); a refused call
prints the gateway's message and exits with 2.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from online_rl.cli.errors import GatewayRefused
from online_rl.config import load_settings

__all__ = ["rollout_app"]

rollout_app = typer.Typer(help="Watch and control canary rollouts on the gateway.", no_args_is_help=True)
_out = Console()


UrlOpt = Annotated[str | None, typer.Option("--url", help="The gateway's base URL (default: the config's).")]
KeyOpt = Annotated[str | None, typer.Option("--key", envvar="ORL_ADMIN_KEY",
                                            help="An API key with the admin scope (or $ORL_ADMIN_KEY).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the gateway's JSON answer.")]
ReasonOpt = Annotated[str | None, typer.Option("--reason", help="Why, for the audit log.")]


def _call(ctx: typer.Context, url: str | None, key: str | None, method: str, path: str,
          body: dict[str, Any] | None = None) -> dict[str, Any]:
    import httpx

    if not key:
        raise GatewayRefused("no API key: pass --key or set ORL_ADMIN_KEY to a key with the admin scope "
                             "(`online-rl keys new --scopes admin`)")
    if url is None:
        gateway = load_settings(ctx.obj["config"]).gateway
        url = f"http://{gateway.host}:{gateway.port}"
    try:
        response = httpx.request(method, url.rstrip("/") + path, json=body, timeout=120,
                                 headers={"Authorization": f"Bearer {key}"})
    except httpx.TransportError as exc:
        raise GatewayRefused(f"cannot reach the gateway at {url} ({exc}); is it running? (--url)") from exc
    try:
        data: dict[str, Any] = response.json()
    except ValueError:
        data = {"error": {"message": response.text[:500]}}
    if response.status_code >= 400:
        message = data.get("error", {}).get("message") or response.text[:500]
        raise GatewayRefused(f"the gateway refused ({response.status_code}): {message}")
    return data


def _show(status: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(status))
        return
    rollout = status.get("rollout")
    _out.print(f"champion: [bold]{status['champion']['model']}[/]")
    if rollout is None:
        _out.print("no rollout yet")
        return
    _out.print(f"rollout {rollout['rollout_id']}: [bold]{rollout['status']}[/] · challenger version "
               f"{rollout['challenger']} at {rollout['weight']:.0%} (step {rollout['step'] + 1} of "
               f"{len(status['plan']['steps'])})")
    table = Table("arm", "version", "rewards", "mean reward", "requests", "error rate", "p99 s")
    for arm, x in status.get("arms", {}).items():
        mean = "—" if x["mean_reward"] is None else f"{x['mean_reward']:.3f}"
        p99 = "—" if x["p99_latency_s"] is None else f"{x['p99_latency_s']:.3f}"
        table.add_row(arm, x["model"], str(x["rewards"]), mean, str(x["requests"]), f"{x['error_rate']:.3f}",
                      p99)
    _out.print(table)
    c = status.get("comparison")
    if c and c["difference"] is not None:
        _out.print(f"difference {c['difference']:+.3f} in [{c['lower']:.3f}, {c['upper']:.3f}] "
                   f"(always-valid), p = {c['p_value']:.3g}")


@rollout_app.command("status")
def status_cmd(ctx: typer.Context, url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """The rollout now: versions, weight, step, reward and health per arm."""
    _show(_call(ctx, url, key, "GET", "/rollout"), as_json)


@rollout_app.command("history")
def history_cmd(ctx: typer.Context, url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False,
                limit: Annotated[int, typer.Option(help="The newest this many decisions.")] = 50) -> None:
    """Every decision, with who took it and why."""
    entries = _call(ctx, url, key, "GET", f"/rollout/history?limit={limit}")["entries"]
    if as_json:
        typer.echo(json.dumps(entries))
        return
    table = Table("time", "rollout", "version", "action", "by", "weight", "reason")
    for e in entries:
        at = datetime.fromtimestamp(e["at"]).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(at, e["rollout_id"], e["version"], e["action"], e["actor"], f"{e['weight']:.0%}",
                      e["reason"])
    _out.print(table)


@rollout_app.command("start")
def start_cmd(ctx: typer.Context, version: Annotated[str | None, typer.Option(
        help="A registered version number (default: MLflow's `challenger`).")] = None,
              url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """Start a rollout (loads the version into every replica first)."""
    _show(_call(ctx, url, key, "POST", "/rollout/start", {"version": version}), as_json)


@rollout_app.command("pause")
def pause_cmd(ctx: typer.Context, url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """Freeze the traffic split and the plan's decisions."""
    _show(_call(ctx, url, key, "POST", "/rollout/pause"), as_json)


@rollout_app.command("resume")
def resume_cmd(ctx: typer.Context, url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """Resume a paused rollout (the step's clock restarts)."""
    _show(_call(ctx, url, key, "POST", "/rollout/resume"), as_json)


@rollout_app.command("weight")
def weight_cmd(ctx: typer.Context,
               weight: Annotated[float, typer.Argument(help="The challenger's share, 0-1 (0.1 = 10%).")],
               url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """Set the challenger's share of traffic by hand."""
    _show(_call(ctx, url, key, "PUT", "/rollout/weight", {"weight": weight}), as_json)


@rollout_app.command("promote")
def promote_cmd(ctx: typer.Context, reason: ReasonOpt = None, url: UrlOpt = None, key: KeyOpt = None,
                as_json: JsonOpt = False) -> None:
    """Promote the challenger now (MLflow's `champion` moves to it)."""
    _show(_call(ctx, url, key, "POST", "/rollout/promote", {"reason": reason}), as_json)


@rollout_app.command("rollback")
def rollback_cmd(ctx: typer.Context, reason: ReasonOpt = None, url: UrlOpt = None, key: KeyOpt = None,
                 as_json: JsonOpt = False) -> None:
    """Roll the challenger back now (traffic to 0, champion kept, adapter unloaded)."""
    _show(_call(ctx, url, key, "POST", "/rollout/rollback", {"reason": reason}), as_json)
