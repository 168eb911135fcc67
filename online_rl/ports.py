"""A free TCP port to hand to a process that will listen on it a moment later.

The usual trick, binding port 0 and closing the socket, returns a port from the kernel's ephemeral
range (`/proc/sys/net/ipv4/ip_local_port_range`, 32768-60999 on Linux by default). That is also the
range every *outgoing* connection draws its local port from, so on a busy machine (Kafka clients,
HTTP clients, a test suite running side by side) a connection can take the port between the check and
the listener's bind, and the listener dies with "address already in use" (seen in CI: a gateway
started on such a port lost it that way). So `free_port` picks at random from a band below the
ephemeral range, which no outgoing connection uses, and checks that it binds; it falls back to
port 0 only where the band is empty (an unusual ephemeral range). Knows nothing about services.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["BAND", "ephemeral_range", "free_port"]

BAND = (20000, 29000)  # [low, high): below Linux's default ephemeral range and the local cluster's 29092
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_TRIES = 200


def ephemeral_range(path: Path = _RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's ephemeral port range as (low, high) inclusive, or None where it cannot be read."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def _candidates(band: tuple[int, int], ephemeral: tuple[int, int] | None) -> list[int]:
    ports = range(*band)
    if ephemeral is None:
        return list(ports)
    low, high = ephemeral
    return [p for p in ports if not low <= p <= high]


def _binds(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", *, rng: random.Random | None = None) -> int:
    """A TCP port on `host` that nothing listens on now and no outgoing connection will take."""
    pick = rng or random.SystemRandom()  # not the seeded global generator: side-by-side tests must differ
    candidates = _candidates(BAND, ephemeral_range())
    for _ in range(min(_TRIES, len(candidates))):
        port = pick.choice(candidates)
        if _binds(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
