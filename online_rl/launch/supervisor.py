"""`online-rl up / down / status`: start, watch and stop the components of `components.plan`.

Each component runs in its own session (so `down` can signal the whole process group), writes its
output to `<run>/logs/<name>.log`, and counts as started only when it answers its ready URL (or stays
alive, for the joiner). Ports are checked before anything starts; a component that exits or does not
become ready in time is reported with the end of its log, and everything started so far is stopped
again. `<run>/state.json` records what runs (pids, URLs, logs) so `status` and `down` work from any
shell; `<run>/keys.json` (mode 0600) holds the run's two API keys, `<run>/mlflow-auth.json` (0600) the
MLflow users (launch/mlflow_auth.py), whose rights are granted as soon as MLflow answers, before any
other component starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from filelock import FileLock

from online_rl.config import Settings
from online_rl.ingest import new_key
from online_rl.launch.components import KAFKA_SCRIPT, SIGNING_KEY, Component, Wiring, plan
from online_rl.launch.errors import LaunchError
from online_rl.launch.mlflow_auth import AUTH_FILE, make_registry_auth
from online_rl.registry.access import RegistryAuth, grant_access
from online_rl.registry.errors import RegistryAccessError

__all__ = ["ComponentStatus", "RunKeys", "down", "read_keys", "read_state", "state_lock", "status", "up",
           "watchdog_alive"]

_STATE, _KEYS, _ENTRIES = "state.json", "keys.json", "api-keys.txt"


@dataclass(frozen=True)
class RunKeys:
    """The run's API keys: `user` (feedback, inference) for clients, `admin` (every scope)."""

    user: str
    admin: str


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    # "ready", "running" (alive, not answering), "restarting" (exited; the watchdog restarts it),
    # "failed" (exited too often; the watchdog gave up), "exited" (no watchdog), "stopped"
    state: str
    url: str | None
    log: str | None
    restarts: int = 0
    problem: str | None = None  # why the watchdog gave up, with the log's last lines


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
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # the watchdog and `down` may write at once
    tmp.unlink(missing_ok=True)  # a leftover file would keep its own (maybe looser) mode
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2)
    os.replace(tmp, path)


def _started_at(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), with the boot id:
    together they tell our process from a later one that was given the same pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except (OSError, IndexError):
        return None
    return f"{boot}:{fields[19]}"


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # our own child (during `up`, or in a test): collect its exit


def _alive(entry: dict[str, Any]) -> bool:
    """Whether the recorded process still runs — the same process, not a later one with its pid."""
    pid = entry.get("pid")
    if not pid:
        return False
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # not ours: the pid was given to another user's process
    try:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    except OSError:
        return False
    recorded = entry.get("started")
    return recorded is None or recorded == _started_at(pid)


def _group_alive(pgid: int) -> bool:
    _reap(pgid)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


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


def _make_signing_key(run_dir: Path) -> None:
    """The run's version-signing key: the trainer signs each version with it, serving trusts only it
    (unless the config names its own `mlflow.signing_key_file` or `mlflow.trusted_signers`). Kept
    across `up`s, like the versions in the run's MLflow store that it signed."""
    from online_rl.registry import new_signing_key

    key, public_file = run_dir / SIGNING_KEY, run_dir / SIGNING_KEY.replace(".pem", ".pub")
    if key.is_file() and public_file.is_file():
        return
    pem, public = new_signing_key()
    key.unlink(missing_ok=True)
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    public_file.write_text(public + "\n")


def _kafka(run: Path, settings: Settings, action: str) -> None:
    env = {
        **os.environ,
        "ORL_KAFKA_PORT": str(settings.launch.kafka_port),
        "ORL_KAFKA_RUN": str(run / "kafka"),
        "ORL_CACHE_DIR": str(settings.cache_dir),
    }
    out = subprocess.run(["bash", str(KAFKA_SCRIPT), action], env=env, capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise LaunchError(f"the Kafka broker did not {action}: {out.stderr.strip() or out.stdout.strip()} "
                          f"(log: {run / 'kafka' / 'broker.log'})")


def _check_ports(settings: Settings, wiring: Wiring, components: list[Component]) -> None:
    wanted: list[tuple[int, str, str]] = [(port, c.name, setting) for c in components
                                          for port, setting in c.ports.items()]
    if wiring.start_broker:
        port = settings.launch.kafka_port
        wanted += [(port, "kafka", "launch.kafka_port"),
                   (port + 1, "kafka controller", "launch.kafka_port (the controller uses the next port)")]
    seen: dict[int, str] = {}
    for port, name, setting in wanted:
        if port in seen:
            raise LaunchError(f"{name} and {seen[port]} are both set to port {port}; give {name} its own "
                              f"port with {setting}")
        seen[port] = name
    taken = [f"port {port} ({name}) is taken by another process; stop it or move {name} with {setting} "
             f"(ORL_{setting.split(' ')[0].upper().replace('.', '__')})"
             for port, name, setting in sorted(wanted) if _port_taken(port)]
    if taken:
        raise LaunchError("cannot start the loop:\n  " + "\n  ".join(taken))


def _launch(component: Component, wiring: Wiring) -> subprocess.Popen[bytes]:
    log = wiring.run_dir / "logs" / f"{component.name}.log"
    with log.open("ab") as out:
        env = {**os.environ, **wiring.env, **component.env}
        return subprocess.Popen(component.argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def _wait_ready(component: Component, process: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    began = time.monotonic()
    while True:
        code = process.poll()
        if code is not None:
            raise LaunchError(f"{component.name} exited during start-up (exit code {code}); the end of "
                              f"{log}:\n{_tail(log)}")
        if component.ready_url is not None and _answers(component.ready_url):
            return
        if component.ready_url is None and time.monotonic() - began >= component.settle_s:
            return
        if time.monotonic() > deadline:
            raise LaunchError(f"{component.name} was not ready within {timeout_s:.0f}s "
                              f"(launch.ready_timeout_s); the end of {log}:\n{_tail(log)}")
        time.sleep(0.5)


def _clear(run: Path) -> None:
    """--fresh: empty the run folder — only one `up` made (it holds state.json), never another folder."""
    if not run.exists():
        return
    if (run / _STATE).exists() or not any(run.iterdir()):
        shutil.rmtree(run)
        return
    raise LaunchError(f"--fresh would delete {run}, which is not a run folder of `online-rl up` (no "
                      f"{_STATE}); point launch.run_dir at a folder of its own")


def up(settings: Settings, config_file: Path | None = None, fresh: bool = False,
       echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Start every component (see the module docstring); returns the run's state."""
    run = settings.run_dir.resolve()
    if run != settings.run_dir:
        launch = settings.launch.model_copy(update={"run_dir": run})
        settings = settings.model_copy(update={"launch": launch})
    state = read_state(run)
    if state is not None:
        running = [c for c in [*state["components"].values(), state.get("watchdog") or {}] if _alive(c)]
        if running:
            names = ", ".join(c["name"] for c in running)
            raise LaunchError(f"the loop in {run} is already running ({names}); see `online-rl status`, "
                              "or stop it with `online-rl down`")
    # The config travels to the components as an absolute path (they may not share our folder).
    config = config_file or (Path(os.environ["ORL_CONFIG"]) if os.environ.get("ORL_CONFIG") else None)
    keys_file = run / _ENTRIES
    wiring, components = plan(settings, config.resolve() if config else None, keys_file, "")
    _check_ports(settings, wiring, components)
    if fresh:
        _clear(run)
    for sub in ("logs", "mlflow", "rollout", "adapters", "trainer", "bus", "kafka"):
        (run / sub).mkdir(parents=True, exist_ok=True)
    keys = _make_keys(run)
    _make_signing_key(run)
    registry = make_registry_auth(run)
    wiring, components = plan(settings, config.resolve() if config else None, keys_file, keys.admin)
    state = {"wiring": wiring.as_dict(), "started_at": time.time(), "components": {}}
    _write_json(run / _STATE, state)
    try:
        if wiring.start_broker:
            echo(f"starting kafka on {wiring.bootstrap} ...")
            # recorded first: an interrupted start is still stopped by `down`
            state["components"]["kafka"] = {"name": "kafka", "pid": None, "url": wiring.bootstrap,
                                            "log": str(run / "kafka" / "broker.log"), "broker": True}
            _write_json(run / _STATE, state)
            _kafka(run, settings, "start")
            pid = _broker_pid(run)
            state["components"]["kafka"].update(pid=pid, started=_started_at(pid) if pid else None)
            _write_json(run / _STATE, state)
        for component in components:
            echo(f"starting {component.name} ...")
            began = time.monotonic()
            process = _launch(component, wiring)
            log = run / "logs" / f"{component.name}.log"
            state["components"][component.name] = {
                "name": component.name, "pid": process.pid, "started": _started_at(process.pid),
                "url": component.url, "ready_url": component.ready_url, "log": str(log)}
            _write_json(run / _STATE, state)
            _wait_ready(component, process, log, settings.launch.ready_timeout_s)
            if component.name == "mlflow":
                _grant_registry_access(registry, wiring, settings, log)
            echo(f"  {component.name} ready in {time.monotonic() - began:.1f}s"
                 + (f" at {component.url}" if component.url else ""))
        if settings.launch.restart:
            watchdog = _start_watchdog(run, config.resolve() if config else None)
            with state_lock(run):  # from here on the watchdog writes the state too
                current = read_state(run) or state
                current["watchdog"] = state["watchdog"] = watchdog
                _write_json(run / _STATE, current)
            launch = settings.launch
            echo(f"watchdog started: a component that exits is restarted (up to {launch.max_restarts} times "
                 f"in {launch.restart_window_s:.0f}s; log: logs/watchdog.log)")
    except BaseException:
        with contextlib.suppress(Exception):
            down(settings, echo=lambda _: None)
        raise
    return state


def _grant_registry_access(registry: RegistryAuth, wiring: Wiring, settings: Settings, log: Path) -> None:
    """Each component's MLflow user and its rights (online_rl/registry/access.py), before any starts."""
    try:
        grant_access(wiring.mlflow_url, registry.admin, registry.users, settings.mlflow.registered_model)
    except RegistryAccessError as exc:
        raise LaunchError(f"{exc} (MLflow's users: {wiring.run_dir / AUTH_FILE}; its log: {log})") from exc


def _start_watchdog(run: Path, config: Path | None) -> dict[str, Any]:
    """`online-rl supervise` in a session of its own (online_rl/launch/watchdog.py), with this process's
    environment and config, so that it plans the components exactly as `up` did."""
    log = run / "logs" / "watchdog.log"
    given = ["--config", str(config)] if config else []
    argv = [sys.executable, "-m", "online_rl.cli", *given, "supervise"]
    with log.open("ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, "ORL_LAUNCH__RUN_DIR": str(run)},
                                   start_new_session=True)
    return {"name": "watchdog", "pid": process.pid, "started": _started_at(process.pid), "log": str(log)}


def state_lock(run: Path) -> FileLock:
    """The lock every writer of `<run>/state.json` after `up` (the watchdog, `down`) holds for its
    read-modify-write."""
    return FileLock(str(run / f"{_STATE}.lock"), timeout=30)


def _broker_pid(run: Path) -> int | None:
    try:
        return int((run / "kafka" / "broker.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _stop(entry: dict[str, Any], timeout_s: float) -> str | None:
    """Stop one component: SIGTERM to its leader (the trainer finishes its step), then to the rest of its
    process group, then SIGKILL to whatever is left. Returns what happened, or None if nothing ran."""
    pid = entry["pid"]
    leader = _alive(entry)
    if not leader and (entry.get("started") is None or not _group_alive(pid)):
        return None  # (a recycled pid's group is not ours: only groups we know we started are signalled)
    if leader:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(entry) and time.monotonic() < deadline:
            time.sleep(0.2)
    _signal_group(pid, signal.SIGTERM)  # helpers the leader left behind (Ray's raylet and workers)
    deadline = time.monotonic() + 5.0
    while _group_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _group_alive(pid):
        _signal_group(pid, signal.SIGKILL)
        return "killed"
    return "stopped"


def down(settings: Settings, echo: Callable[[str], None] = print) -> list[str]:
    """Stop every component of the run, newest first (see `_stop`). Returns the names stopped."""
    run = settings.run_dir.resolve()
    state = read_state(run)
    if state is None:
        echo(f"nothing to stop: no run in {run}")
        return []
    watchdog = state.get("watchdog")
    if watchdog and watchdog.get("pid"):  # first, so that it restarts nothing being stopped
        _stop(watchdog, settings.launch.stop_timeout_s)
        state = read_state(run) or state  # the pids it last recorded
    stopped = []
    try:
        for entry in reversed(list(state["components"].values())):
            name = entry["name"]
            if entry.get("broker"):
                if entry.get("pid") and not _alive(entry):
                    continue
                _kafka(run, settings, "stop")  # also stops a broker whose start was interrupted
                stopped.append(name)
                echo(f"stopped {name}")
                continue
            if not entry.get("pid"):
                continue
            outcome = _stop(entry, settings.launch.stop_timeout_s)
            if outcome is None:
                continue
            echo(f"{outcome} {name}" + (" (it did not stop in time)" if outcome == "killed" else ""))
            stopped.append(name)
    finally:
        with state_lock(run):
            for entry in [*state["components"].values(), *([watchdog] if watchdog else [])]:
                entry["pid"] = None
            state["watchdog"] = watchdog
            state["stopped_at"] = time.time()
            _write_json(run / _STATE, state)
    return stopped


def status(settings: Settings) -> tuple[dict[str, Any] | None, list[ComponentStatus]]:
    """The run's wiring and each component's state (`ready` when it answers its ready URL)."""
    state = read_state(settings.run_dir.resolve())
    if state is None:
        return None, []
    out = []
    watching = _alive(state.get("watchdog") or {})
    for entry in state["components"].values():
        pid = entry.get("pid")
        problem = None
        if entry.get("gave_up") and not _alive(entry):
            health = "failed"
            problem = f"{entry['gave_up']['reason']}; the end of its log:\n{entry['gave_up']['tail']}"
        elif pid is None:
            health = "stopped"
        elif not _alive(entry):
            health = "restarting" if watching else "exited"
        elif entry.get("ready_url") and not _answers(entry["ready_url"]):
            health = "running"
        else:
            health = "ready"
        out.append(ComponentStatus(entry["name"], pid, health, entry.get("url"), entry.get("log"),
                                   int(entry.get("restarts", 0)), problem))
    return state["wiring"], out


def watchdog_alive(settings: Settings) -> bool:
    """Whether the run's watchdog is running (restarting components that exit)."""
    state = read_state(settings.run_dir.resolve())
    return state is not None and _alive(state.get("watchdog") or {})
