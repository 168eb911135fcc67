"""Key partitioning: Kafka's Java-compatible murmur2, the same on both backends."""

from __future__ import annotations

import pytest

from online_rl.bus import murmur2, partition_for


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafkas_reference_values(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_partition_is_stable_and_in_range() -> None:
    for n in (1, 3, 4, 16):
        for i in range(200):
            key = f"req-{i}".encode()
            assert 0 <= partition_for(key, n) < n
            assert partition_for(key, n) == partition_for(key, n)
