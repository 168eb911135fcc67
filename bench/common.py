"""Shared helpers for the benchmarks: a Kafka broker for the run, and the JSON result line."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KAFKA_SCRIPT = ROOT / "deploy" / "local" / "kafka" / "kafka.sh"


@contextmanager
def kafka_broker(bootstrap: str | None, port: int = 19292) -> Iterator[str]:
    """`bootstrap` if given, else a local broker on `port` started (and stopped) for the run."""
    if bootstrap:
        yield bootstrap
        return
    env = {**os.environ, "ORL_KAFKA_PORT": str(port)}
    out = subprocess.run(["bash", str(KAFKA_SCRIPT), "start"], env=env, check=True,
                         capture_output=True, text=True)
    try:
        yield out.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(["bash", str(KAFKA_SCRIPT), "stop"], env=env, capture_output=True)


def emit(result: dict[str, Any]) -> None:
    """Print the result as the last line of output: one JSON object."""
    print(json.dumps(result, sort_keys=True), flush=True)
