"""online-rl: teach a deployed LLM from its users' live feedback.

The library package. It holds events, the bus, training, registry and serving logic; it knows
nothing about HTTP frameworks (those live in `services/`). Its public API: `Trainer`, `Parallel`,
`Flow` and `Step` (docs/trainer.md#flows).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("online-rl")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["Flow", "Parallel", "Step", "Trainer", "__version__"]

_PUBLIC = {"Trainer": "online_rl.trainer.controller", "Parallel": "online_rl.trainer.flows",
           "Flow": "online_rl.flow.graph", "Step": "online_rl.flow.graph"}


def __getattr__(name: str) -> object:
    """The public API (`from online_rl import Trainer, Parallel, Flow, Step`), imported on first use:
    the services import this package without torch."""
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'online_rl' has no attribute {name!r}")
