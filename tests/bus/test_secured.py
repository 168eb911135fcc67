"""A Kafka whose only listener asks for TLS and SASL SCRAM-SHA-512: every kind of client the
components use (admin, transactional producer, consumer group) works through `kafka.*`, and a wrong
password, an untrusted CA or a plaintext client is refused with an error that names the setting."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from online_rl.bus import BusUnavailable, open_bus
from online_rl.config import Settings
from tests.conftest import SecuredBroker
from tests.factories import drain, tls_folder

pytestmark = pytest.mark.kafka


def test_every_client_works_over_tls_and_scram(secured_broker: SecuredBroker) -> None:
    bus = open_bus(Settings(kafka=secured_broker.kafka_settings()))
    topic = f"secured-{time.time_ns()}"
    bus.create_topic(topic, partitions=2)
    assert bus.partitions(topic) == 2

    producer = bus.producer(transactional_id=f"{topic}-tx")
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, f"v{i}".encode(), key=f"k{i}".encode())
    consumer = bus.consumer(f"{topic}-group")
    producer.commit_transaction({}, consumer)
    consumer.subscribe([topic])
    records = drain(consumer, 10)
    assert sorted(r.value for r in records) == sorted(f"v{i}".encode() for i in range(10))
    consumer.commit(consumer.next_offsets(records))
    assert sum(bus.end_offsets(topic).values()) >= 10  # + the transaction's commit markers
    consumer.close()
    producer.close()


def test_a_wrong_password_an_untrusted_ca_or_plaintext_is_refused_and_named(
        secured_broker: SecuredBroker, tmp_path: Path) -> None:
    wrong = open_bus(Settings(kafka=secured_broker.kafka_settings(password="not-the-password")))
    with pytest.raises(BusUnavailable, match=r"kafka\.sasl_password"):
        wrong.partitions("anything")

    other_ca = tls_folder(tmp_path / "other") / "ca.pem"
    untrusted_settings = {**secured_broker.kafka_settings(), "ssl_ca_location": str(other_ca)}
    untrusted = open_bus(Settings(kafka=untrusted_settings))
    with pytest.raises(BusUnavailable, match=r"kafka\.ssl_ca_location"):
        untrusted.partitions("anything")

    plaintext = open_bus(Settings(kafka={"bootstrap_servers": secured_broker.bootstrap}))
    with pytest.raises(BusUnavailable, match="did not answer"):
        plaintext.partitions("anything")
