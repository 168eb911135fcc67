"""Graceful stops for the long-running commands: SIGTERM or SIGINT sets an event the loop checks."""

from __future__ import annotations

import logging
import signal
import threading

__all__ = ["stop_on_signals"]

logger = logging.getLogger(__name__)


def stop_on_signals(finishing: str) -> threading.Event:
    """An event set by SIGTERM/SIGINT (logged as 'finishing `finishing`, then stopping'). Install it after
    `ray.init`, which installs handlers of its own."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logger.info("signal %d: finishing %s, then stopping", signum, finishing)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop
