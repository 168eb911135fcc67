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


def test_a_transactional_call_blocked_past_its_timeout_gives_the_producer_up() -> None:
    """librdkafka's send_offsets_to_transaction can block for good, past its timeout, after a whole-cluster
    outage (it waits on a coordinator dropped from the metadata: librdkafka 5456, 5511). The call is
    given its timeout and a grace; past them the producer is named broken, which the joiner replaces,
    and it is never flushed again (its blocked call owns it). A call that returns or fails in time is
    untouched. No broker: a producer only connects when it has something to send."""
    import threading

    from online_rl.bus.kafka import KafkaBus

    producer = KafkaBus("127.0.0.1:1").producer()
    released = threading.Event()
    assert producer._in_time(lambda: None, 0.1, "a quick call") is None  # type: ignore[attr-defined]
    with pytest.raises(BusUnavailable):  # an error in time is the call's own
        producer._in_time(lambda: _raise(BusUnavailable("away")), 0.1, "x")  # type: ignore[attr-defined]
    with pytest.raises(ProducerBroken, match="sending the offsets did not return within 2s, past its 0s"):
        producer._in_time(released.wait, 0.1, "sending the offsets")  # type: ignore[attr-defined]
    # (it returned while the call was still blocked: the call is released only below)
    flushed: list[float] = []

    class Handle:  # stands in for the given-up librdkafka handle, to see whether it is flushed
        def flush(self, timeout: float) -> int:
            flushed.append(timeout)
            return 0

    producer._p = Handle()  # type: ignore[attr-defined]
    producer.close()
    assert flushed == []
    released.set()


def _raise(exc: Exception) -> None:
    raise exc
