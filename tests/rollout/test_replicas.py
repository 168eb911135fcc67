"""Replica sources: fixed URLs and `dns+` names re-resolved into one URL per address."""

from __future__ import annotations

import asyncio

import pytest

from online_rl.config import GatewayConfig
from services.gateway.replicas import ReplicaPool


def test_a_dns_source_becomes_one_replica_per_address_and_keeps_their_state() -> None:
    pool = ReplicaPool(["http://10.0.0.9:8081", "dns+http://localhost:8081"], None)
    assert [r.url for r in pool.replicas] == ["http://10.0.0.9:8081"]  # resolved only by discover()
    assert asyncio.run(pool.discover()) is True
    urls = [r.url for r in pool.replicas]
    assert urls[0] == "http://10.0.0.9:8081" and "http://127.0.0.1:8081" in urls
    assert all(u.endswith(":8081") for u in urls)
    local = next(r for r in pool.replicas if r.url == "http://127.0.0.1:8081")
    local.failures = 3  # a replica's state survives a re-resolution that finds it again
    assert asyncio.run(pool.discover()) is False
    assert next(r for r in pool.replicas if r.url == "http://127.0.0.1:8081").failures == 3


def test_a_name_that_does_not_resolve_gives_no_replicas_and_the_pool_refuses_cleanly() -> None:
    pool = ReplicaPool(["dns+http://no-such-replica.invalid:8081"], None)
    assert asyncio.run(pool.discover()) is False
    assert pool.replicas == []
    with pytest.raises(Exception, match="no inference replica answered"):
        asyncio.run(pool.send("GET", "/v1/models"))


def test_bad_replica_urls_are_refused_with_the_setting_named() -> None:
    with pytest.raises(ValueError, match="dns\\+http://host:port"):
        GatewayConfig(replicas=["inference:8081"])
    with pytest.raises(ValueError, match=r"gateway\.replicas entry"):
        ReplicaPool(["dns+http:///no-host"], None)
