"""The local launcher: every component of the loop as a local process (`online-rl up/down/status`)."""

from online_rl.launch.components import Component, Wiring, plan
from online_rl.launch.errors import LaunchError
from online_rl.launch.mlflow_auth import AUTH_FILE, read_registry_auth
from online_rl.launch.supervisor import (
    ComponentStatus,
    RunKeys,
    down,
    read_keys,
    read_state,
    status,
    up,
    watchdog_alive,
)

__all__ = [
    "AUTH_FILE",
    "Component",
    "ComponentStatus",
    "LaunchError",
    "RunKeys",
    "Wiring",
    "down",
    "plan",
    "read_keys",
    "read_registry_auth",
    "read_state",
    "status",
    "up",
    "watchdog_alive",
]
