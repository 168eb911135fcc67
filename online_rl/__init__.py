"""online-rl: teach a deployed LLM from its users' live feedback.

The library package. It holds events, the bus, training, registry and serving logic; it knows
nothing about HTTP frameworks (those live in `services/`).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("online-rl")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
