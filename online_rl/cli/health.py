"""`online-rl healthcheck`: the container images' HEALTHCHECK, and the joiner's liveness probe.

A component that serves HTTP announces its health URL in the file `$ORL_HEALTH_FILE` (the images
set it; nothing is written without it), and `healthcheck` asks that URL. A loop without an HTTP
endpoint (the joiner) touches `$ORL_HEARTBEAT_FILE` as it goes round, and `healthcheck` checks
that the file is fresh: a loop stuck for longer than `--heartbeat-age` is unhealthy.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["Heartbeat", "announce_health", "healthcheck_cmd"]


class Heartbeat:
    """Touches `$ORL_HEARTBEAT_FILE` (at most every `every_s` seconds) each time `beat()` is called;
    does nothing when the variable is not set."""

    def __init__(self, every_s: float = 5.0) -> None:
        file = os.environ.get("ORL_HEARTBEAT_FILE")
        self.file = Path(file) if file else None
        self.every_s = every_s
        self._last = float("-inf")

    def beat(self) -> None:
        now = time.monotonic()
        if self.file is not None and now - self._last >= self.every_s:
            self.file.touch()
            self._last = now


def announce_health(url: str) -> None:
    """Record where this container's component answers health checks (when the image asks)."""
    file = os.environ.get("ORL_HEALTH_FILE")
    if file:
        Path(file).write_text(url + "\n")


def healthcheck_cmd(
    url: Annotated[str | None, typer.Argument(help="URL to check (default: $ORL_HEALTHCHECK_URL, else the "
                                              "URL the running component announced).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the answer.")] = 3.0,
    heartbeat_age: Annotated[float, typer.Option(
        help="A heartbeat ($ORL_HEARTBEAT_FILE) older than this many seconds is unhealthy.")] = 120.0,
) -> None:
    """Exit 0 when the component answers its health URL with 200 (or, without one, when its heartbeat
    is fresh), 1 otherwise. A component with neither is healthy while it runs."""
    import httpx

    file = os.environ.get("ORL_HEALTH_FILE")
    url = url or os.environ.get("ORL_HEALTHCHECK_URL")
    if url is None and file and Path(file).is_file():
        url = Path(file).read_text().strip() or None
    beat = os.environ.get("ORL_HEARTBEAT_FILE")
    if url is None and beat:
        _check_heartbeat(Path(beat), heartbeat_age)
        return
    if url is None:
        typer.echo("healthy: no health URL announced and no heartbeat (nothing to check)")
        return
    try:
        status = httpx.get(url, timeout=timeout).status_code
    except httpx.HTTPError as exc:
        typer.echo(f"unhealthy: {url}: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(1) from exc
    if status != 200:
        typer.echo(f"unhealthy: {url} answered {status}", err=True)
        raise typer.Exit(1)
    typer.echo(f"healthy: {url}")


def _check_heartbeat(file: Path, max_age: float) -> None:
    try:
        age = time.time() - file.stat().st_mtime
    except FileNotFoundError as exc:
        typer.echo(f"unhealthy: no heartbeat yet at {file}", err=True)
        raise typer.Exit(1) from exc
    if age > max_age:
        typer.echo(f"unhealthy: the last heartbeat is {age:.0f}s old (more than {max_age:.0f}s)", err=True)
        raise typer.Exit(1)
    typer.echo(f"healthy: heartbeat {age:.0f}s ago")
