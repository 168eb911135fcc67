"""`online-rl up / down / status`: start, watch and stop the components of `components.plan`.

Each component runs in its own session (so `down` can signal the whole process group), writes its
output to `<run>/logs/<name>.log`, and counts as started only when it answers its ready URL (or stays
alive, for the joiner). Ports are checked before anything starts; a component that exits or does not
become ready in time is reported with the end of its log, and everything started so far is stopped
again. `<run>/state.json` records what runs (pids, URLs, logs) so `status` and `down` work from any
shell; `<run>/keys.json` (mode 0600) holds the run's two API keys.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from online_rl.config import Settings
from online_rl.errors import OnlineRLError
from online_rl.ingest import new_key
from online_rl.launch.components import KAFKA_SCRIPT, Component, Wiring, plan

__all__ = ["ComponentStatus", "LaunchError", "RunKeys", "down", "read_keys", "read_state", "status", "up"]

_STATE, _KEYS, _ENTRIES = "state.json", "keys.json", "api-keys.txt"


class LaunchError(OnlineRLError):
    """A component could not be started (the message says which, why and where its log is)."""


@dataclass(frozen=True)
class RunKeys:
    """The run's API keys: `user` (feedback, inference) for clients, `admin` (every scope)."""

    user: str
    admin: str


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    state: str  # "ready", "running" (alive, not answering), "exited", "stopped"
    url: str | None
    log: str | None


def read_state(run_dir: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads((run_dir / _STATE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return state


def read_keys(run_dir: Path) -> RunKeys:
    try:
        data = json.loads((run_dir / _KEYS).read_text())
        return RunKeys(user=data["user"], admin=data["admin"])
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        raise LaunchError(f"no API keys in {run_dir} (start the loop with `online-rl up`)") from exc


def _write_json(path: Path, data: object, mode: int = 0o644) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2)
    os.replace(tmp, path)


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in text[-lines:])


def _make_keys(run_dir: Path) -> RunKeys:
    user, user_digest = new_key()
    admin, admin_digest = new_key()
    _write_json(run_dir / _KEYS, {"user": user, "admin": admin}, mode=0o600)
    (run_dir / _ENTRIES).write_text(
        f"{user_digest} feedback,inference  # user\n{admin_digest} feedback,inference,admin,tester  # admin\n"
    )
    return RunKeys(user, admin)


def _kafka(wiring: Wiring, settings: Settings, action: str) -> None:
    env = {
        **os.environ,
        "ORL_KAFKA_PORT": str(settings.launch.kafka_port),
        "ORL_KAFKA_RUN": str(wiring.run_dir / "kafka"),
        "ORL_CACHE_DIR": str(settings.cache_dir),
    }
    out = subprocess.run(
        ["bash", str(KAFKA_SCRIPT), action], env=env, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise LaunchError(
            f"the Kafka broker did not {action}: {out.stderr.strip() or out.stdout.strip()} "
            f"(log: {wiring.run_dir / 'kafka' / 'broker.log'})"
        )


def _check_ports(settings: Settings, wiring: Wiring, components: list[Component]) -> None:
    wanted = {port: (c.name, setting) for c in components for port, setting in c.ports.items()}
    if wiring.start_broker:
        port = settings.launch.kafka_port
        wanted[port] = ("kafka", "launch.kafka_port")
        wanted[port + 1] = ("kafka controller", "launch.kafka_port (the controller uses the next port)")
    taken = [
        f"port {port} ({name}) is taken by another process; stop it or move {name} with {setting} "
        f"(ORL_{setting.upper().replace('.', '__')})"
        for port, (name, setting) in sorted(wanted.items())
        if _port_taken(port)
    ]
    if taken:
        raise LaunchError("cannot start the loop:\n  " + "\n  ".join(taken))


def _start(component: Component, wiring: Wiring, settings: Settings) -> subprocess.Popen[bytes]:
    log = wiring.run_dir / "logs" / f"{component.name}.log"
    with log.open("ab") as out:
        env = {**os.environ, **wiring.env, **component.env}
        process = subprocess.Popen(
            component.argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            cwd=wiring.run_dir,
        )
    deadline = time.monotonic() + settings.launch.ready_timeout_s
    alive_since = time.monotonic()
    while True:
        code = process.poll()
        if code is not None:
            raise LaunchError(
                f"{component.name} exited during start-up (exit code {code}); the end of {log}:\n{_tail(log)}"
            )
        if component.ready_url is not None and _answers(component.ready_url):
            return process
        if component.ready_url is None and time.monotonic() - alive_since >= component.settle_s:
            return process
        if time.monotonic() > deadline:
            _signal_group(process.pid, signal.SIGKILL)
            raise LaunchError(
                f"{component.name} was not ready within {settings.launch.ready_timeout_s:.0f}s "
                f"(launch.ready_timeout_s); the end of {log}:\n{_tail(log)}"
            )
        time.sleep(0.5)


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def up(
    settings: Settings,
    config_file: Path | None = None,
    fresh: bool = False,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Start every component (see the module docstring); returns the run's state."""
    run = settings.run_dir
    state = read_state(run)
    if state is not None:
        running = [c for c in state["components"].values() if _alive(c.get("pid"))]
        if running:
            names = ", ".join(c["name"] for c in running)
            raise LaunchError(
                f"the loop in {run} is already running ({names}); see `online-rl status`, "
                "or stop it with `online-rl down`"
            )
    if fresh and run.exists():
        shutil.rmtree(run)
    for sub in ("logs", "mlflow", "rollout", "adapters", "trainer", "bus", "kafka"):
        (run / sub).mkdir(parents=True, exist_ok=True)
    keys = _make_keys(run)
    # The components run in the run folder: a relative config path would not be found from there.
    config = config_file or (Path(os.environ["ORL_CONFIG"]) if os.environ.get("ORL_CONFIG") else None)
    wiring, components = plan(settings, config.resolve() if config else None, run / _ENTRIES, keys.admin)
    _check_ports(settings, wiring, components)
    state = {"wiring": wiring.as_dict(), "started_at": time.time(), "components": {}}
    _write_json(run / _STATE, state)
    try:
        if wiring.start_broker:
            echo(f"starting kafka on {wiring.bootstrap} ...")
            _kafka(wiring, settings, "start")
            state["components"]["kafka"] = {
                "name": "kafka",
                "pid": _broker_pid(run),
                "url": wiring.bootstrap,
                "log": str(run / "kafka" / "broker.log"),
                "broker": True,
            }
            _write_json(run / _STATE, state)
        for component in components:
            echo(f"starting {component.name} ...")
            began = time.monotonic()
            process = _start(component, wiring, settings)
            state["components"][component.name] = {
                "name": component.name,
                "pid": process.pid,
                "url": component.url,
                "ready_url": component.ready_url,
                "log": str(run / "logs" / f"{component.name}.log"),
            }
            _write_json(run / _STATE, state)
            echo(
                f"  {component.name} ready in {time.monotonic() - began:.1f}s"
                + (f" at {component.url}" if component.url else "")
            )
    except BaseException:
        down(settings, echo=lambda _: None)
        raise
    return state


def _broker_pid(run: Path) -> int | None:
    for pidfile in (run / "kafka").glob("broker.pid"):
        try:
            return int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
    return None


def down(settings: Settings, echo: Callable[[str], None] = print) -> list[str]:
    """Stop every component of the run, newest first: SIGTERM to its process group, then SIGKILL after
    `launch.stop_timeout_s`. Returns the names stopped."""
    run = settings.run_dir
    state = read_state(run)
    if state is None:
        echo(f"nothing to stop: no run in {run}")
        return []
    stopped = []
    for entry in reversed(list(state["components"].values())):
        name, pid = entry["name"], entry.get("pid")
        if entry.get("broker"):
            wiring = state["wiring"]
            _kafka(Wiring(run, "kafka", wiring["bootstrap"], True, "", "", "", "", "", {}), settings, "stop")
            stopped.append(name)
            echo(f"stopped {name}")
            continue
        if not _alive(pid):
            continue
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + settings.launch.stop_timeout_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            _signal_group(pid, signal.SIGKILL)
            echo(f"killed {name} (it did not stop within {settings.launch.stop_timeout_s:.0f}s)")
        else:
            echo(f"stopped {name}")
        stopped.append(name)
    for entry in state["components"].values():
        entry["pid"] = None
    state["stopped_at"] = time.time()
    _write_json(run / _STATE, state)
    return stopped


def status(settings: Settings) -> tuple[dict[str, Any] | None, list[ComponentStatus]]:
    """The run's wiring and each component's state (`ready` when it answers its ready URL)."""
    state = read_state(settings.run_dir)
    if state is None:
        return None, []
    out = []
    for entry in state["components"].values():
        pid = entry.get("pid")
        if pid is None:
            health = "stopped"
        elif not _alive(pid):
            health = "exited"
        elif entry.get("ready_url") and not _answers(entry["ready_url"]):
            health = "running"
        else:
            health = "ready"
        out.append(ComponentStatus(entry["name"], pid, health, entry.get("url"), entry.get("log")))
    return state["wiring"], out
