"""The command line's own exceptions: a command refused before or by the service it calls. Like every
`OnlineRLError`, the CLI prints them without a traceback."""

from __future__ import annotations

from online_rl.errors import OnlineRLError

__all__ = ["GatewayRefused", "SimulationRefused"]


class GatewayRefused(OnlineRLError):
    """The gateway answered with an error (its message says why)."""


class SimulationRefused(OnlineRLError):
    """The simulation's options do not make sense (the message says which and how to fix it)."""
