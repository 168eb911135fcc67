"""The local Kafka broker: real produce and consume, and clear errors from the start script."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from online_rl.ports import free_port
from tests.conftest import KAFKA_SCRIPT


@pytest.mark.kafka
def test_produce_and_consume_on_a_real_broker(kafka_bootstrap: str) -> None:
    topic = f"orl.test.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)

    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "acks": "all"})
    delivered: list[str] = []
    for i in range(10):
        producer.produce(topic, key=f"k{i % 3}", value=f"v{i}", on_delivery=lambda e, m: delivered.append(
            "err" if e else m.value().decode()))
    assert producer.flush(30) == 0
    assert sorted(delivered) == sorted(f"v{i}" for i in range(10))

    consumer = Consumer({
        "bootstrap.servers": kafka_bootstrap,
        "group.id": f"g-{uuid.uuid4().hex[:6]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    seen: list[str] = []
    for _ in range(60):
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            seen.append(msg.value().decode())
        if len(seen) == 10:
            break
    consumer.close()
    assert sorted(seen) == sorted(f"v{i}" for i in range(10))


def test_start_refuses_a_taken_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {**os.environ, "ORL_KAFKA_PORT": str(port), "ORL_KAFKA_HOME": str(tmp_path)}
        result = subprocess.run(["bash", str(KAFKA_SCRIPT), "start"], env=env, capture_output=True, text=True)
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is already taken" in result.stderr
    assert "ORL_KAFKA_PORT" in result.stderr


def test_start_without_java_says_what_to_install(tmp_path: Path) -> None:
    # A PATH with the shell tools the script needs but no java.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "cat", "grep", "sed", "head", "tail", "ls", "mkdir", "rm", "sleep"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    env = {
        "PATH": str(bin_dir),
        "HOME": str(tmp_path),
        "ORL_KAFKA_PORT": str(free_port()),
        "ORL_KAFKA_HOME": str(tmp_path / "kafka"),
    }
    bash = shutil.which("bash")
    assert bash is not None
    result = subprocess.run([bash, str(KAFKA_SCRIPT), "start"], env=env, capture_output=True, text=True)
    assert result.returncode == 1
    assert "Java 17 or newer is needed" in result.stderr
    assert "openjdk-17" in result.stderr
