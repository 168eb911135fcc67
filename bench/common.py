"""Shared helpers for the benchmarks: a Kafka broker for the run, an `online-rl` service in its own
process, the spread of figures measured over alternated rounds, and the JSON result line.

Every benchmark runs its two sides alternately over rounds (A B, B A, A B, ...: neither side always
runs first or on a warmer machine), reports the median of the per-round figures with their range
(`spread`), and takes `--smoke`: tiny sizes that finish in seconds and still print every documented
field (its `FIELDS`), which CI checks so that a benchmark cannot break unseen."""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
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
    # a broker already answering on that port (another benchmark's) is used and left running
    with socket.socket() as probe:
        probe.settimeout(2)
        answering = probe.connect_ex(("127.0.0.1", port)) == 0
    if answering:
        yield f"127.0.0.1:{port}"
        return
    # else one in a folder of this run's own: topics kept from earlier runs only slow a broker down
    folder = tempfile.mkdtemp(prefix=f"orl-bench-kafka-{port}-")
    env["ORL_KAFKA_RUN"] = folder
    out = subprocess.run(["bash", str(KAFKA_SCRIPT), "start"], env=env, check=True,
                         capture_output=True, text=True)
    try:
        yield out.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(["bash", str(KAFKA_SCRIPT), "stop"], env=env, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def start_cli_service(args: list[str], env: dict[str, str], url: str, what: str,
                      timeout_s: float = 300.0) -> subprocess.Popen[bytes]:
    """Run `online-rl <args>` with `env` added, and return once `url`/readyz answers 200."""
    import httpx

    process = subprocess.Popen([sys.executable, "-m", "online_rl.cli", *args], env={**os.environ, **env},
                               cwd=ROOT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise SystemExit(f"the {what} exited during start-up")
        time.sleep(0.5)
    process.kill()
    raise SystemExit(f"the {what} did not become ready")


def embedded_env(work: Path, model_dir: Path) -> dict[str, str]:
    """The environment of services that share one run folder: the embedded bus, an MLflow SQLite
    store and the given model, no Kafka."""
    return {"ORL_CACHE_DIR": str(work / "cache"), "ORL_BUS__EMBEDDED_PATH": str(work / "bus.db"),
            "ORL_KAFKA__BOOTSTRAP_SERVERS": "", "ORL_MODEL__PATH": str(model_dir),
            "ORL_MLFLOW__TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}


def emit(result: dict[str, Any], precision: str | None = None) -> None:
    """Print the machine line (CPU model, ISA, cores, precision), then the result as the last line of
    output: one JSON object, with the machine in it too."""
    from online_rl.hardware import machine_info, machine_line

    print(machine_line(precision), flush=True)
    result = {**result, "machine": machine_info(precision)}
    print(json.dumps(result, sort_keys=True), flush=True)


def precisions(requested: str) -> list[str]:
    """The precisions a benchmark runs: `auto` means float32 always, and bfloat16 as well where
    `precision: auto` picks it on this machine (on an AVX2-only CPU a bf16 run would take hours);
    otherwise the comma-separated list given."""
    if requested != "auto":
        return [p for p in requested.split(",") if p]
    from online_rl.hardware import resolve_precision

    choice = resolve_precision("auto", log_choice=False)
    print(f"precision auto on this machine: {choice.describe()}", flush=True)
    return ["fp32", "bf16"] if choice.precision == "bf16" else ["fp32"]


def spread(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """The median of per-round figures and their range: {"median", "min", "max", "rounds"}."""
    if not values:
        raise ValueError("spread of no rounds: run at least one round")
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "rounds": len(values)}


def put_spread(result: dict[str, Any], name: str, values: Sequence[float], digits: int = 3) -> None:
    """`result[name]`: the median over rounds; `result[name + "_range"]`: [min, max]."""
    s = spread(values, digits)
    result[name], result[f"{name}_range"] = s["median"], [s["min"], s["max"]]


def percentile(values: Sequence[float], q: int) -> float:
    """The q-th percentile (1-99) of `values` (interpolated between the closest ranks)."""
    if not values:
        raise ValueError("percentile of no values")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def alternated(rounds: int, sides: Sequence[str]) -> list[list[str]]:
    """The order the sides run in each round: as given in even rounds, reversed in odd ones."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1 (got {rounds})")
    return [list(sides) if r % 2 == 0 else list(reversed(sides)) for r in range(rounds)]


def missing_fields(result: dict[str, Any], fields: Sequence[str]) -> list[str]:
    """The documented fields a result line lacks (`FIELDS` of a benchmark; CI's smoke test uses it)."""
    return [name for name in fields if name not in result]
