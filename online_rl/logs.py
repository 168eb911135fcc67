"""Process-wide logging: readable lines for people, or one JSON object per line for log pipelines.

With JSON, every record carries its time, level, logger and message, plus the structured fields the
code passes as `extra=` (the trainer's `event`, `step`, `samples`, `version`, ...), so a log store
can filter on them without parsing messages. Knows nothing about what is logged.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

__all__ = ["LogFormat", "configure_logging"]

LogFormat = Literal["text", "json"]


def configure_logging(level: int = logging.INFO, fmt: LogFormat = "text") -> None:
    """Send the root logger's records to stderr as text lines or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        ))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # httpx logs every request at INFO: a line per relayed request in the gateway, and time taken
    # from serving. Their warnings still show.
    for noisy in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
