"""Starting or joining the Ray runtime: a local one on this machine by default.

Knows how to reach Ray; knows nothing about the actors that run on it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from online_rl.config import Settings

__all__ = ["init_ray"]

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
