"""How a producer's KafkaException becomes the bus's error (pure logic): the joiner replaces a broken
producer, retries an unavailable bus and stops when fenced, so the kind decides what it survives.

The case that ended the joiner before: a bus outage longer than a commit's timeout left the
transaction needing an abort, and the abort itself failed with a fatal INVALID_TXN_STATE, which escaped
as a raw KafkaException (bench/chaos.py's bus part, every node down 45 s)."""

from __future__ import annotations

import confluent_kafka as ck
import pytest

from online_rl.bus import BusUnavailable, ProducerBroken, ProducerFenced
from online_rl.bus.kafka import _producer_error


def _exc(code: int, fatal: bool = False) -> ck.KafkaException:
    return ck.KafkaException(ck.KafkaError(code, "broker said so", fatal=fatal))


@pytest.mark.parametrize(("code", "fatal", "kind"), [
    (ck.KafkaError.INVALID_TXN_STATE, True, ProducerBroken),  # the abort after a long outage
    (ck.KafkaError.INVALID_TXN_STATE, False, ProducerBroken),
    (ck.KafkaError._STATE, False, ProducerBroken),
    (ck.KafkaError._FATAL, True, ProducerBroken),
    (ck.KafkaError.PRODUCER_FENCED, True, ProducerFenced),
    (ck.KafkaError._FENCED, True, ProducerFenced),
    (ck.KafkaError._TIMED_OUT, False, BusUnavailable),
    (ck.KafkaError._TRANSPORT, False, BusUnavailable),
])
def test_each_producer_failure_is_named_for_what_the_joiner_does_next(code: int, fatal: bool,
                                                                    kind: type) -> None:
    error = _producer_error(_exc(code, fatal), "the transaction could not be aborted")
    assert type(error) is kind
    assert str(error).startswith("the transaction could not be aborted") and "broker said so" in str(error)
