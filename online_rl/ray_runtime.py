"""Starting or joining the Ray runtime: a local one on this machine by default.

Knows how to reach Ray; knows nothing about the actors that run on it.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from online_rl.config import Settings
    from online_rl.hardware import PrecisionChoice

__all__ = ["init_ray", "resolve_precision_on"]

logger = logging.getLogger(__name__)


def init_ray(settings: Settings) -> None:
    """Connect to `settings.ray.address`, or start a local runtime with `settings.ray.num_cpus`."""
    import ray

    if ray.is_initialized():
        return
    if settings.ray.address:
        ray.init(address=settings.ray.address, logging_level=logging.WARNING)
    else:
        # Ray's processes may start bound to one core (see `release_affinity`); released as they appear,
        # the runtime starts in about 7 s instead of 11 on the 2-core machine, where it once waited
        # for its own processes sharing core 0.
        starting, found = threading.Event(), [0]

        def keep_releasing() -> None:
            while not starting.wait(0.1):
                found[0] += release_affinity()

        watcher = threading.Thread(target=keep_releasing, name="orl-ray-affinity", daemon=True)
        watcher.start()
        try:
            ray.init(
                num_cpus=settings.ray.num_cpus,
                include_dashboard=False,
                logging_level=logging.WARNING,
            )
        finally:
            starting.set()
            watcher.join()
        released = found[0] + release_affinity()
        if released:
            logger.info("ray runtime: %d processes were bound to fewer cores than this one; released",
                        released, extra={"event": "ray_affinity_released"})
    logger.info("ray runtime ready: %s", ray.cluster_resources())


def release_affinity() -> int:
    """Give the Ray processes this driver started (GCS, raylet, its idle workers) the driver's CPU cores.

    Measured on the 2-core machine: with Intel OpenMP preloaded (deploy/local/env.sh, for vLLM) and torch
    imported before `ray.init`, the GCS server and the raylet start bound to core 0 alone, and every
    worker the raylet starts inherits that: all actors then share one core while the other idles. The
    processes are found as this process's descendants (Linux /proc); returns how many were bound
    narrower than the driver (0 elsewhere)."""
    if not hasattr(os, "sched_setaffinity") or not Path("/proc/self/task").exists():
        return 0
    cores = os.sched_getaffinity(0)
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    released, todo = 0, list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            narrower = os.sched_getaffinity(pid) != cores
            for task in Path(f"/proc/{pid}/task").iterdir():
                os.sched_setaffinity(int(task.name), cores)
        except OSError:
            continue  # ended meanwhile, or not ours
        released += narrower
    return released


def _resolve(requested: str, device: str, model_dir: str, threads: int, cache_dir: str | None,
             what: str) -> PrecisionChoice:
    from online_rl.hardware import model_hidden_size, resolve_precision

    return resolve_precision(requested, device, model_hidden_size(model_dir), threads,
                             Path(cache_dir) if cache_dir else None, what)


def resolve_precision_on(strategy: Any, resources: dict[str, float], requested: str, device: str,
                         model_dir: str, threads: int, cache_dir: Path | None, what: str) -> PrecisionChoice:
    """Resolve a `precision` setting where the workers will compute: a Ray task with the workers'
    `resources` and scheduling `strategy` (their placement group's bundle), so that the probe runs on
    their device with their threads (see online_rl/hardware.py)."""
    import ray

    if requested == "fp32":  # nothing to measure
        from online_rl.hardware import choose_precision

        return choose_precision("fp32", None)
    task: Any = ray.remote(_resolve).options(scheduling_strategy=strategy, **resources)
    choice: PrecisionChoice = ray.get(task.remote(requested, device, model_dir, threads,
                                                  str(cache_dir) if cache_dir else None, what))
    logger.info("%s: %s", what, choice.describe())
    return choice
