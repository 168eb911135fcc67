"""Events: validation with clear messages, the wire format, and typed decode errors."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from pydantic import ValidationError

from online_rl.errors import MalformedRecord, UnsupportedSchemaVersion
from online_rl.events import Feedback, FeedbackKind, Interaction, TrainingSample, decode, encode
from online_rl.stream.join import JoinConfig, JoinState
from tests.factories import interaction, preference, rating, thumbs


def test_every_event_type_round_trips() -> None:
    state = JoinState(JoinConfig(window_s=1.0, retention_s=1.0))
    state.add_interaction(interaction("r1"))
    state.add_feedback(thumbs("r1", up=True))
    (sample,) = state.advance(1e6)
    for event, kind in ((interaction("r1"), Interaction), (rating("r1", 4.0), Feedback),
                        (preference("a", "b"), Feedback), (sample, TrainingSample)):
        data = encode(event)
        assert data[:1] == b"\x01"
        assert decode(data, kind) == event


def test_wire_format_is_compact() -> None:
    event = interaction("r1", completion_token_ids=list(range(64)), completion_logprobs=[-0.5] * 64)
    assert len(encode(event)) < len(event.model_dump_json())


def test_a_newer_schema_version_is_a_typed_error() -> None:
    body = msgspec.msgpack.decode(encode(thumbs("r1", up=True))[1:])
    body["schema_version"] = 99
    with pytest.raises(UnsupportedSchemaVersion, match=r"schema_version 99 is newer.*upgrade online-rl"):
        decode(b"\x01" + msgspec.msgpack.encode(body), Feedback)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "wire format"),
        (b"{json}", "wire format"),
        (b"\x01\xc1", "not MessagePack"),
        (encode(interaction("r1")), "is not 'feedback'"),
        (b"\x01" + msgspec.msgpack.encode({"type": "feedback", "event_id": "e"}), "invalid feedback"),
    ],
)
def test_malformed_records_are_typed_errors(data: bytes, message: str) -> None:
    with pytest.raises(MalformedRecord, match=message):
        decode(data, Feedback)


def test_logprobs_must_match_the_completion_tokens() -> None:
    with pytest.raises(ValidationError, match="one log-probability per completion token"):
        interaction("r1", completion_token_ids=[1, 2, 3], completion_logprobs=[-0.1])
    with pytest.raises(ValidationError, match="<= 0"):
        interaction("r1", completion_token_ids=[1], completion_logprobs=[0.5])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "thumbs", "value": 0}, "value 1 \\(up\\) or -1 \\(down\\)"),
        ({"kind": "rating", "value": 9, "scale": (1, 5)}, "must lie on its scale"),
        ({"kind": "rating", "value": 3}, "needs value and scale"),
        ({"kind": "scalar"}, "needs a value"),
        ({"kind": "implicit", "value": 3}, "needs a signal name"),
        ({"kind": "preference", "other_request_id": "r2"}, "needs other_request_id and winner"),
        ({"kind": "preference", "other_request_id": "r1", "winner": "this"}, "two different request ids"),
        ({"kind": "stars", "value": 1}, "kind"),
        ({"kind": "thumbs", "value": 1, "request_id": "has space"}, "request_id"),
    ],
)
def test_feedback_validation_names_the_problem(fields: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"event_id": "e1", "request_id": "r1", "user_id": "u1", "created_at": 1.0}
    with pytest.raises(ValidationError, match=message):
        Feedback(**{**base, **fields})


def test_feedback_kinds_are_the_contract() -> None:
    assert {k.value for k in FeedbackKind} == {"thumbs", "rating", "scalar", "preference", "implicit"}


@pytest.mark.parametrize(
    "body",
    [{"type": []}, {"type": {"a": 1}}, {1: "feedback"}, ["feedback"], 7, None,
     {"type": "feedback", "nested": {2: b"x"}}, {"type": "interaction", "completion_logprobs": b"abc"}],
)
def test_poison_records_are_typed_errors_not_crashes(body: object) -> None:
    """Bodies that once escaped as TypeError / AttributeError and crash-looped the joiner (issue 23)."""
    for kind in (Interaction, Feedback, TrainingSample):
        with pytest.raises(MalformedRecord):
            decode(b"\x01" + msgspec.msgpack.encode(body), kind)


def _values() -> object:
    from hypothesis import strategies as st

    ints = st.integers(-2**63, 2**64 - 1)  # what MessagePack can carry
    leaves = st.none() | st.booleans() | ints | st.floats() | st.text(max_size=20) | st.binary(max_size=20)
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=8) | ints, inner, max_size=4), max_leaves=12)


def test_any_bytes_decode_to_an_event_or_a_typed_error() -> None:
    """Arbitrary MessagePack bodies, valid events with one field replaced by anything, and raw bytes:
    `decode` returns an event or raises a `DecodeError`, never anything else."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from online_rl.errors import DecodeError

    valid = [msgspec.msgpack.decode(encode(e)[1:]) for e in (interaction("r1"), thumbs("r1", up=True),
                                                            rating("r1", 4.0), preference("a", "b"))]
    fields = sorted({k for body in valid for k in body})

    def check(data: bytes) -> None:
        for kind in (Interaction, Feedback, TrainingSample):
            with contextlib.suppress(DecodeError):  # anything else fails the test
                decode(data, kind)

    @settings(max_examples=400, deadline=None, database=None)
    @given(st.data())
    def run(data: st.DataObject) -> None:
        choice = data.draw(st.sampled_from(["any", "mutated", "raw"]))
        if choice == "raw":
            check(data.draw(st.binary(max_size=64)))
            return
        if choice == "any":
            body = data.draw(_values())  # type: ignore[arg-type]
        else:
            body = dict(data.draw(st.sampled_from(valid)))
            body[data.draw(st.sampled_from(fields))] = data.draw(_values())  # type: ignore[arg-type]
        check(b"\x01" + msgspec.msgpack.encode(body))

    run()


@pytest.mark.parametrize(
    ("change", "field"),
    [({"reward": float("nan")}, "reward"), ({"reward": float("inf")}, "reward"),
     ({"prompt_token_ids": [1, -3]}, "prompt_token_ids.1"), ({"created_at": float("inf")}, "created_at"),
     ({"completion": {"request_id": "a", "text": "x", "token_ids": [1], "logprobs": [float("-inf")]}},
      "completion.logprobs")],
)
def test_values_no_loss_can_use_are_refused(change: dict[str, object], field: str) -> None:
    """NaN or infinite rewards, negative token ids, -inf log-probs: each would poison a loss."""
    good = {"sample_id": "s1", "kind": "single", "model": "m", "user_id": "u",
            "prompt": [{"role": "user", "content": "q"}], "prompt_token_ids": [1, 2],
            "completion": {"request_id": "a", "text": "x", "token_ids": [1], "logprobs": [-0.5]},
            "reward": 1.0, "reward_mapping_version": "v", "behaviour_versions": [None], "created_at": 1.0}
    TrainingSample.model_validate(good)
    with pytest.raises(ValidationError) as caught:
        TrainingSample.model_validate(good | change)
    assert any(".".join(map(str, e["loc"])) == field for e in caught.value.errors()), caught.value.errors()
