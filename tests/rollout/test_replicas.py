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


def test_a_connection_the_replica_drops_before_answering_is_tried_once_more_not_failed_over() -> None:
    """A pooled connection the replica closes as a request goes out (its keep-alive ran out) is a
    reset before any answer: the pool opens a new connection to the same replica, the client sees
    200, and the replica is not marked failed. A second drop in a row is a failure."""

    async def scenario(drops: int) -> tuple[int | str, int, int]:
        connections = 0

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            await reader.readuntil(b"\r\n\r\n")
            if connections <= drops:
                writer.transport.abort()  # a reset, no answer
                return
            body = b'{"ok": true}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = ReplicaPool([f"http://127.0.0.1:{port}"], None)
        try:
            try:
                upstream = await pool.send("POST", "/v1/chat/completions", b"{}")
                status: int | str = upstream.response.status
                upstream.response.release()
            except Exception as exc:  # the outcome is what the test reads
                status = type(exc).__name__
            return status, connections, pool.replicas[0].failures
        finally:
            await pool.close()
            server.close()
            await server.wait_closed()

    assert asyncio.run(scenario(drops=1)) == (200, 2, 0)
    assert asyncio.run(scenario(drops=2)) == ("ReplicaUnavailable", 2, 1)
