"""The watchdog of `online-rl up`: restarts components that exit, as a Kubernetes Deployment would.

`up` starts it as a process of its own (`online-rl supervise`, in its own session, logging to
`<run>/logs/watchdog.log`) once every component is ready; `down` stops it before anything else. Every
second it checks each recorded component (the same process: pid and start time): one that is gone is
restarted after a backoff (`launch.restart_backoff_s`, doubled for each restart within
`launch.restart_window_s`, at most `launch.restart_backoff_max_s`) with its own command, environment
and log. Each restart is recorded in `<run>/state.json` — the count, the times, the exit code when
known and the log's last lines at the exit — for `status` and the demo's report. After
`launch.max_restarts` restarts within the window it gives up on the component and records why.

`RestartPolicy` is the rule, pure: earlier restart times in, when to restart (or give up) out.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from online_rl.config import Settings
from online_rl.launch.components import Component, plan
from online_rl.launch.supervisor import (
    _ENTRIES,
    _STATE,
    _alive,
    _broker_pid,
    _kafka,
    _launch,
    _started_at,
    _stop,
    _tail,
    _write_json,
    read_keys,
    read_state,
    state_lock,
)

__all__ = ["RestartPolicy", "Watchdog"]

logger = logging.getLogger(__name__)

_TAIL_LINES = 20


@dataclass(frozen=True)
class RestartPolicy:
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0
    max_restarts: int = 5
    window_s: float = 600.0

    @classmethod
    def from_settings(cls, settings: Settings) -> RestartPolicy:
        launch = settings.launch
        return cls(launch.restart_backoff_s, launch.restart_backoff_max_s, launch.max_restarts,
                   launch.restart_window_s)

    def restart_at(self, restarts: Sequence[float], exited_at: float) -> float | None:
        """When to restart a component that exited at `exited_at`, given the times of its earlier
        restarts (None: give up, it was restarted `max_restarts` times within the window already)."""
        recent = sum(1 for at in restarts if exited_at - at < self.window_s)
        if recent >= self.max_restarts:
            return None
        return exited_at + min(self.backoff_max_s, self.backoff_s * 2.0 ** recent)


class Watchdog:
    """Restarts the components of the run in `settings.run_dir` (see the module docstring)."""

    def __init__(self, settings: Settings, config_file: Path | None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.run = settings.run_dir.resolve()
        self.policy = RestartPolicy.from_settings(settings)
        self.clock = clock
        keys = read_keys(self.run)
        self.wiring, components = plan(settings, config_file, self.run / _ENTRIES, keys.admin)
        self.components: dict[str, Component] = {c.name: c for c in components}
        self.children: dict[str, subprocess.Popen[bytes]] = {}  # the processes this watchdog started
        self.due: dict[str, float] = {}  # name -> when to restart it

    def run_until(self, stop: threading.Event, interval_s: float = 1.0) -> None:
        logger.info("watchdog on %s: restarting components that exit (%s)", self.run, self.policy)
        while not stop.wait(interval_s):
            try:
                self.tick()
            except Exception:  # a bad pass (a state file being replaced, ...) must not end the watch
                logger.exception("watchdog pass failed")

    def tick(self) -> None:
        """One pass: notice exits, restart what is due, give up on what crashes too often."""
        state = read_state(self.run) or {"components": {}}
        for name, entry in state["components"].items():
            child = self.children.get(name)
            if child is not None and child.pid == entry.get("pid"):
                child.poll()  # our own child: collect its exit code before `_alive` reaps it
            if entry.get("gave_up") or not self._watched(entry) or _alive(entry):
                continue
            now = self.clock()
            if name not in self.due:
                self._exited(name, entry, now)
            elif now >= self.due[name]:
                self._restart(name, entry)

    @staticmethod
    def _watched(entry: dict[str, Any]) -> bool:
        """Started by `up` and not stopped by `down` (which clears the pids)."""
        return bool(entry.get("pid"))

    def _exited(self, name: str, entry: dict[str, Any], now: float) -> None:
        child = self.children.get(name)
        code = child.returncode if child is not None and child.pid == entry.get("pid") else None
        tail = _tail(Path(entry["log"]), _TAIL_LINES) if entry.get("log") else "(no log)"
        exit_info = {"at": now, "code": code, "tail": tail}
        due = self.policy.restart_at(entry.get("restart_times", []), now)
        if due is None:
            reason = (f"{name} exited {self.policy.max_restarts + 1} times within "
                      f"{self.policy.window_s:.0f}s (launch.max_restarts, launch.restart_window_s); "
                      f"not restarted again (exit code {code if code is not None else 'unknown'})")
            logger.error("%s; the end of %s:\n%s", reason, entry.get("log"), tail)
            self._update(name, last_exit=exit_info, gave_up={"at": now, "reason": reason, "tail": tail})
            return
        self.due[name] = due
        logger.warning("%s exited (exit code %s); restarting in %.1fs; the end of %s:\n%s", name,
                       code if code is not None else "unknown", due - now, entry.get("log"), tail)
        self._update(name, last_exit=exit_info)

    def _restart(self, name: str, entry: dict[str, Any]) -> None:
        del self.due[name]
        component = self.components.get(name)
        if component is None and not entry.get("broker"):  # not in the plan any more (another config)
            self._update(name, gave_up={"at": self.clock(), "reason": f"{name} is not in the plan",
                                        "tail": ""})
            return
        # the attempt counts whether or not it starts, so a restart that keeps failing ends in giving up
        times = [*entry.get("restart_times", []), self.clock()]
        self._update(name, restarts=len(times), restart_times=times)
        try:
            if entry.get("broker"):
                _kafka(self.run, self.settings, "start")
                pid = _broker_pid(self.run)
            else:
                assert component is not None
                _stop(entry, 5.0)  # what the dead leader left in its process group (it may hold the port)
                process = _launch(component, self.wiring)
                self.children[name] = process
                pid = process.pid
        except Exception as exc:
            logger.error("restarting %s failed: %s", name, exc)
            self._update(name, last_exit={"at": self.clock(), "code": None, "tail": f"restart failed: {exc}"})
            return  # still down: the next pass treats it as a new exit (backoff, or giving up)
        logger.info("restarted %s (pid %s; restart %d)", name, pid, len(times))
        self._update(name, pid=pid, started=_started_at(pid) if pid else None)

    def _update(self, name: str, **fields: Any) -> None:
        with state_lock(self.run):
            state = read_state(self.run)
            if state is None or name not in state["components"]:
                return
            entry = state["components"][name]
            if not self._watched(entry):  # `down` stopped it meanwhile: leave it stopped
                return
            entry.update(fields)
            _write_json(self.run / _STATE, state)
