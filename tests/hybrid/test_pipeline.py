"""The asynchronous rollout pipeline's bookkeeping (pure logic): how far ahead batches are sampled, how
stale each is when it trains, and what happens to one older than the bound."""

from __future__ import annotations

from typing import Any

import pytest

from online_rl.hybrid.pipeline import Batch, StalenessPipeline


def _run(pipeline: StalenessPipeline, steps: int, trains: Any = lambda step: True
         ) -> tuple[list[int], list[int], int, list[int]]:
    """Drive the pipeline as the loop does; the staleness of each trained batch, the versions that sampled
    them, how many were submitted and the most ever in flight."""
    version, submitted = 0, []
    stale, sampled, peak = [], [], []

    def submit(v: int) -> Batch:
        submitted.append(v)
        return Batch(handle=len(submitted), adapter=f"sync{v}", version=v)

    for step in range(steps):
        batch, staleness, _ = pipeline.next(version, submit, lambda b: b.handle)
        peak.append(len(pipeline.inflight))
        stale.append(staleness)
        sampled.append(batch.version)
        assert batch.result == batch.handle
        if trains(step):
            version += 1
    return stale, sampled, len(submitted), peak


def test_no_staleness_samples_each_batch_with_the_newest_adapter() -> None:
    stale, sampled, submitted, peak = _run(StalenessPipeline(0), 5)
    assert stale == [0] * 5 and sampled == [0, 1, 2, 3, 4] and submitted == 5 and max(peak) == 0


@pytest.mark.parametrize("bound", [1, 2])
def test_batches_are_sampled_ahead_and_train_exactly_bound_updates_later(bound: int) -> None:
    stale, _, submitted, peak = _run(StalenessPipeline(bound), 6)
    assert stale == [min(step, bound) for step in range(6)]  # the first batches were sampled by the start
    assert max(peak) == bound  # `bound` batches sample while one trains
    assert submitted == 6 + bound


def test_a_step_that_trains_nothing_makes_the_next_batch_fresher() -> None:
    stale, _, _, _ = _run(StalenessPipeline(2), 6, trains=lambda step: step != 3)
    assert stale[4] == 1 and max(stale) <= 2


def test_past_the_bound_wait_samples_no_further_ahead() -> None:
    pipeline = StalenessPipeline(1, ahead=3, stale="wait")
    stale, _, _, peak = _run(pipeline, 8)
    assert max(stale) == 1 and max(peak) == 1 and pipeline.dropped == 0


def test_past_the_bound_drop_discards_and_refills_with_the_newest_adapter() -> None:
    pipeline = StalenessPipeline(1, ahead=3, stale="drop")
    released: list[Batch] = []

    def submit(v: int) -> Batch:
        return Batch(handle=None, adapter=f"sync{v}", version=v)

    trained = []
    for version in range(8):
        _, staleness, dropped = pipeline.next(version, submit, lambda b: None, released.append)
        assert all(version - b.version > 1 for b in dropped)
        trained.append(staleness)
    assert max(trained) <= 1  # nothing older than the bound trains
    assert pipeline.dropped > 0 and len(released) == pipeline.dropped  # the stale ones were dropped, released
    assert sum(pipeline.histogram.values()) == 8


def test_past_the_bound_keep_trains_them_and_counts_their_staleness() -> None:
    pipeline = StalenessPipeline(1, ahead=3, stale="keep")
    stale, _, _, _ = _run(pipeline, 8)
    assert max(stale) == 3 and pipeline.dropped == 0
    assert pipeline.histogram == {0: 1, 1: 1, 2: 1, 3: 5}


def test_negative_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_staleness"):
        StalenessPipeline(-1)
