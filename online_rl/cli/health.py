"""`online-rl healthcheck`: the container images' HEALTHCHECK.

A component that serves HTTP announces its health URL in the file `$ORL_HEALTH_FILE` (the images
set it; nothing is written without it), and `healthcheck` asks that URL. Kubernetes does not use
this: the Helm chart gives every container its own probes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["announce_health", "healthcheck_cmd"]


def announce_health(url: str) -> None:
    """Record where this container's component answers health checks (when the image asks)."""
    file = os.environ.get("ORL_HEALTH_FILE")
    if file:
        Path(file).write_text(url + "\n")


def healthcheck_cmd(
    url: Annotated[str | None, typer.Argument(help="URL to check (default: $ORL_HEALTHCHECK_URL, else the "
                                              "URL the running component announced).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the answer.")] = 3.0,
) -> None:
    """Exit 0 when the component answers its health URL with 200, 1 otherwise. A component without
    an HTTP endpoint (the joiner) announces none: then there is nothing to check and the answer is 0."""
    import httpx

    file = os.environ.get("ORL_HEALTH_FILE")
    url = url or os.environ.get("ORL_HEALTHCHECK_URL")
    if url is None and file and Path(file).is_file():
        url = Path(file).read_text().strip() or None
    if url is None:
        typer.echo("healthy: no health URL announced (a component without an HTTP endpoint)")
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
