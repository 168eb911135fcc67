"""`free_port`: a port outside the kernel's ephemeral range that binds now (pure logic and one socket)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from online_rl import ports
from online_rl.ports import BAND, ephemeral_range, free_port


def test_the_ephemeral_range_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    file = tmp_path / "range"
    file.write_text("32768\t60999\n")
    assert ephemeral_range(file) == (32768, 60999)
    file.write_text("garbage")
    assert ephemeral_range(file) is None
    assert ephemeral_range(tmp_path / "missing") is None


def test_candidates_leave_out_the_ephemeral_range() -> None:
    assert ports._candidates((100, 110), (105, 200)) == [100, 101, 102, 103, 104]
    assert ports._candidates((100, 103), None) == [100, 101, 102]
    assert ports._candidates((100, 103), (0, 65535)) == []


def test_a_free_port_binds_and_lies_in_the_band_outside_the_ephemeral_range() -> None:
    seen = {free_port() for _ in range(20)}
    ephemeral = ephemeral_range()
    for port in seen:
        assert BAND[0] <= port < BAND[1]
        assert ephemeral is None or not ephemeral[0] <= port <= ephemeral[1]
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    assert len(seen) > 1  # drawn at random, so side-by-side tests do not ask for the same port


def test_a_port_in_use_is_never_returned() -> None:
    with socket.socket() as squatter:
        port = free_port()
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        # A generator that offers the taken port first: free_port must move on to another.
        rng = random.Random(0)
        first = [True]

        class Offer(random.Random):
            def choice(self, seq):  # type: ignore[no-untyped-def, override]
                if first[0]:
                    first[0] = False
                    return port
                return rng.choice(seq)

        other = free_port(rng=Offer())
        assert other != port
        assert first == [False]
