"""Starting or joining the Ray runtime: a local one on this machine by default.

Knows how to reach Ray; knows nothing about the actors that run on it.
"""

from __future__ import annotations

import logging
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
        ray.init(
            num_cpus=settings.ray.num_cpus,
            include_dashboard=False,
            logging_level=logging.WARNING,
        )
    logger.info("ray runtime ready: %s", ray.cluster_resources())


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
