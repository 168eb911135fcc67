"""The join's logic on crafted timelines (pure: no bus)."""

from __future__ import annotations

import pytest

from online_rl.errors import ConfigError
from online_rl.events import Feedback
from online_rl.stream.join import JoinConfig, JoinState, decode_forward
from tests.factories import interaction, preference, rating, thumbs


def _state(**kwargs: object) -> JoinState:
    return JoinState(JoinConfig(window_s=10.0, retention_s=30.0, **kwargs))  # type: ignore[arg-type]


def test_feedback_in_the_window_is_joined_when_the_window_closes() -> None:
    state = _state()
    assert state.add_interaction(interaction("r1", created_at=100.0)) == []
    assert state.add_feedback(thumbs("r1", up=True, created_at=105.0)) == []
    assert state.advance(109.0) == []
    (sample,) = state.advance(110.5)
    assert sample.kind == "single" and sample.reward == 1.0 and sample.label is True
    assert sample.completion is not None and sample.completion.request_id == "r1"
    assert sample.sample_id == "s-r1"
    assert sample.feedback_event_ids == ["e-r1-105.0-True"]
    assert state.advance(200.0) == []


def test_feedback_before_the_interaction_is_visible_still_joins() -> None:
    state = _state()
    state.add_feedback(thumbs("r1", up=False, created_at=100.5))
    state.add_interaction(interaction("r1", created_at=100.0))
    (sample,) = state.advance(111.0)
    assert sample.reward == 0.0 and sample.label is False


def test_duplicate_event_ids_count_once() -> None:
    state = _state(aggregation="sum")
    state.add_interaction(interaction("r1"))
    state.add_feedback(thumbs("r1", up=True, event_id="same"))
    state.add_feedback(thumbs("r1", up=True, event_id="same"))
    (sample,) = state.advance(1000.0)
    assert sample.reward == 1.0
    assert state.stats["duplicate_feedback"] == 1


@pytest.mark.parametrize(
    ("aggregation", "expected"), [("sum", 1.5), ("mean", 0.75), ("earliest", 0.5), ("latest", 1.0)]
)
def test_aggregations(aggregation: str, expected: float) -> None:
    state = _state(aggregation=aggregation)
    state.add_interaction(interaction("r1", created_at=100.0))
    state.add_feedback(rating("r1", 5.0, created_at=104.0))  # 1.0
    state.add_feedback(rating("r1", 3.0, created_at=102.0))  # 0.5
    (sample,) = state.advance(111.0)
    assert sample.reward == pytest.approx(expected)


def test_late_feedback_is_counted_not_trained_on() -> None:
    state = _state()
    state.add_interaction(interaction("r1", created_at=100.0))
    state.add_feedback(thumbs("r1", up=True, created_at=104.0))
    assert len(state.advance(111.0)) == 1
    assert state.add_feedback(thumbs("r1", up=False, created_at=112.0)) == []
    # Also late by event time even before the window was closed by processing time.
    state.add_interaction(interaction("r2", created_at=200.0))
    state.add_feedback(thumbs("r2", up=True, created_at=215.0))
    assert state.advance(211.0) == []  # no in-time feedback, no default
    assert state.stats["late_feedback"] == 2
    assert state.stats["no_feedback"] == 1


def test_default_reward_when_the_window_closes_without_feedback() -> None:
    state = _state(default_reward=0.5)
    state.add_interaction(interaction("r1", created_at=100.0))
    (sample,) = state.advance(111.0)
    assert sample.defaulted is True and sample.reward == 0.5


def test_preference_becomes_a_pair_once_both_interactions_are_known() -> None:
    state = _state()
    state.add_interaction(interaction("a", completion="good", completion_token_ids=[5],
                                      completion_logprobs=[-0.5], adapter_version="p-v2"))
    assert state.add_feedback(preference("a", "b", winner="other")) == []  # b not seen yet
    (pair,) = state.add_interaction(interaction("b", completion="better", completion_token_ids=[6],
                                                completion_logprobs=[-0.4]))
    assert pair.kind == "pair"
    assert pair.chosen is not None and pair.chosen.request_id == "b"
    assert pair.rejected is not None and pair.rejected.request_id == "a"
    assert pair.behaviour_versions == [None, "p-v2"]
    assert state.add_feedback(preference("a", "b", winner="other")) == []  # duplicate event id
    # The preference does not make "a" or "b" a single sample (they had no scalar feedback).
    assert state.advance(1000.0) == []


def test_preference_on_different_prompts_is_dropped() -> None:
    state = _state()
    state.add_interaction(interaction("a"))
    state.add_interaction(interaction("b", prompt_token_ids=[9, 9]))
    assert state.add_feedback(preference("a", "b")) == []
    assert state.stats["pair_prompt_mismatch"] == 1


def test_state_survives_a_restart_in_the_middle_of_a_window() -> None:
    state = _state()
    state.add_interaction(interaction("r1", created_at=100.0))
    state.add_feedback(thumbs("r1", up=True, created_at=103.0, event_id="x"))
    state.add_feedback(preference("r1", "r2"))
    changelog = state.drain_changes()

    restarted = _state()
    restarted.restore(changelog)
    assert restarted.add_feedback(thumbs("r1", up=True, created_at=103.0, event_id="x")) == []
    assert restarted.stats["duplicate_feedback"] == 1
    (pair,) = restarted.add_interaction(interaction("r2", created_at=101.0))
    assert pair.kind == "pair"
    singles = restarted.advance(112.0)
    assert [s.sample_id for s in singles] == ["s-r1"]


def test_bad_config_says_how_to_fix() -> None:
    with pytest.raises(ConfigError, match="aggregation"):
        JoinConfig(aggregation="median")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="window_s"):
        JoinConfig(window_s=0)


def test_late_feedback_read_before_its_interaction_is_not_trained_on() -> None:
    state = _state(default_reward=0.5)
    state.add_feedback(thumbs("r1", up=True, created_at=150.0))  # 50 s after the request: late
    state.add_interaction(interaction("r1", created_at=100.0))
    (sample,) = state.advance(111.0)
    assert sample.defaulted is True and sample.reward == 0.5
    assert state.stats["late_feedback"] == 1


def test_early_feedback_does_not_make_its_entry_expire_before_the_window() -> None:
    state = _state()  # window 10 s, retention 30 s
    state.add_feedback(thumbs("r1", up=True, created_at=100.0, event_id="early"))
    state.add_interaction(interaction("r1", created_at=135.0))  # first_seen moves to 135
    state.add_feedback(thumbs("r1", up=True, created_at=136.0, event_id="in-time"))
    assert state.advance(141.0) == []  # 100 + 10 + 30 has passed, but the entry is younger now
    (sample,) = state.advance(146.0)
    assert sample.feedback_event_ids == ["early", "in-time"]  # skewed clocks: early still counts


def test_one_requests_state_stays_small_whatever_its_feedback() -> None:
    """Free text is kept out of the join state and feedback per request is capped: a few 200 KB
    corrections on one request id once made its changelog record larger than a Kafka message."""
    state = _state(max_feedback_per_request=8)
    state.add_interaction(interaction("r1", created_at=100.0))
    for i in range(20):
        state.add_feedback(thumbs("r1", up=True, created_at=101.0, event_id=f"e{i}").model_copy(
            update={"comment": "c" * 8000, "corrected_completion": "x" * 200_000}))
    (record,) = state.drain_changes().values()
    assert record is not None and len(record) < 4000
    assert state.stats["feedback_over_cap"] == 12
    (sample,) = state.advance(200.0)
    assert sample.reward == 1.0 and len(sample.feedback_event_ids) == 8
    with pytest.raises(ConfigError, match="max_feedback_per_request"):
        JoinConfig(max_feedback_per_request=0)


def test_a_sample_that_cannot_be_valid_is_dropped_not_raised() -> None:
    """A rating on the scale [-inf, 5] once made a NaN reward: the joined sample failed validation and the
    joiner crashed on the same records after every restart. The scale is refused now, and the join drops
    (and counts) any sample that still fails, rather than raising."""
    with pytest.raises(ValueError, match="rating scale"):
        Feedback.model_validate(rating("r1", 4.0).model_dump() | {"scale": (float("-inf"), 5.0)})
    state = _state()
    state.add_interaction(interaction("r1", created_at=100.0))
    state.add_feedback(rating("r1", 4.0, created_at=101.0).model_copy(update={"scale": (float("-inf"), 5.0)}))
    state.add_interaction(interaction("r2", created_at=100.0))
    state.add_feedback(thumbs("r2", up=True, created_at=101.0))
    assert [s.sample_id for s in state.advance(200.0)] == ["s-r2"]
    assert state.stats["invalid_sample"] == 1


def test_only_the_user_an_answer_was_served_to_can_judge_it() -> None:
    state = _state(aggregation="sum")
    state.add_interaction(interaction("r1", created_at=100.0))  # served to u1
    state.add_feedback(thumbs("r1", up=False, created_at=101.0))
    for n in range(5):  # someone who learnt the request id, posing as five other users
        state.add_feedback(thumbs("r1", up=True, created_at=102.0, event_id=f"f{n}", user_id=f"x{n}"))
    (sample,) = state.advance(111.0)
    assert sample.reward == 0.0 and sample.label is False and sample.feedback_event_ids == [
        "e-r1-101.0-False"]
    assert state.stats["wrong_user"] == 5
    # only forged feedback: nothing to train on (not even the default reward would be evidence)
    state.add_interaction(interaction("r2", created_at=200.0))
    state.add_feedback(thumbs("r2", up=True, created_at=201.0, user_id="x0"))
    assert state.advance(211.0) == [] and state.stats["no_feedback"] == 1
    # a preference between answers served to different users is no pair
    state.add_interaction(interaction("a", created_at=300.0))
    state.add_interaction(interaction("b", created_at=300.0, user_id="u2"))
    assert state.add_feedback(preference("a", "b", created_at=301.0)) == []
    assert state.stats["wrong_user"] == 7


# -- tasks: a preference across two partitions -----------------------------------------------------
def _tasks() -> tuple[JoinState, JoinState]:
    """Two tasks of one join: "a…" request ids belong to the first, everything else to the second."""
    config = JoinConfig(window_s=10.0, retention_s=30.0)
    return (JoinState(config, is_local=lambda rid: rid.startswith("a")),
            JoinState(config, is_local=lambda rid: not rid.startswith("a")))


def _deliver(sender: JoinState, receiver: JoinState) -> list[object]:
    out: list[object] = []
    for _other, payload in sender.drain_forwards():
        out.extend(receiver.add_forwarded(*decode_forward(payload)))
    return out


def test_a_preference_across_tasks_pairs_once_in_the_task_of_its_other_request() -> None:
    a_task, b_task = _tasks()
    a_task.add_interaction(interaction("a1", created_at=100.0))
    b_task.add_interaction(interaction("b1", created_at=100.5))
    assert a_task.add_feedback(preference("a1", "b1", winner="this")) == []
    (pair,) = _deliver(a_task, b_task)
    assert pair.kind == "pair" and pair.chosen.request_id == "a1" and pair.rejected.request_id == "b1"
    # The stand-in of a1 in the second task is never closed as a sample; each request closes once, at home.
    a_singles = a_task.advance(1000.0)
    b_singles = b_task.advance(1000.0)
    assert [s.sample_id for s in a_singles + b_singles] == []  # no thumbs: no single samples at all
    assert a_task.stats["forwarded_out"] == 1 and b_task.stats["pairs"] == 1 and a_task.stats["pairs"] == 0


def test_a_forwarded_preference_waits_for_its_other_interaction_and_survives_a_restore() -> None:
    a_task, b_task = _tasks()
    a_task.add_feedback(preference("a1", "b1", winner="other"))  # before its own interaction
    assert a_task.drain_forwards() == []
    a_task.add_interaction(interaction("a1", created_at=100.0))
    forwards = a_task.drain_forwards()
    assert [other for other, _ in forwards] == ["b1"]
    assert b_task.add_forwarded(*decode_forward(forwards[0][1])) == []  # b1 not seen yet
    # The second task restarts from its changelog before b1 arrives.
    restored = JoinState(b_task.config, is_local=lambda rid: not rid.startswith("a"))
    restored.restore(b_task.drain_changes())
    (pair,) = restored.add_interaction(interaction("b1", created_at=101.0))
    assert pair.chosen.request_id == "b1" and pair.rejected.request_id == "a1"
    # The same forward again (a duplicate) pairs nothing.
    assert restored.add_forwarded(*decode_forward(forwards[0][1])) == []
    assert restored.stats["duplicate_feedback"] == 1
    assert restored.advance(1000.0) == []


def test_a_preference_between_two_requests_of_one_task_is_not_forwarded() -> None:
    a_task, _ = _tasks()
    a_task.add_interaction(interaction("a1"))
    a_task.add_interaction(interaction("a2"))
    (pair,) = a_task.add_feedback(preference("a1", "a2"))
    assert pair.kind == "pair" and a_task.drain_forwards() == []


def test_a_forward_that_is_not_one_is_refused() -> None:
    _, b_task = _tasks()
    for data in (b"", b"\x81\xa1i\xc4\x00", b"not msgpack"):
        with pytest.raises(Exception):  # noqa: B017 - any decode error: the joiner dead-letters it
            decode_forward(data)
    # A forward to the wrong task (its other request is not local there) is counted and dropped.
    assert b_task.add_forwarded(interaction("b9"), preference("b9", "a1")) == []
    assert b_task.stats["forward_misrouted"] == 1
