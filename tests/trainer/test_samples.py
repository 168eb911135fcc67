"""Routing samples to algorithms, and the cold-start file's checks (pure: no model, no bus)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from online_rl.errors import ConfigError
from online_rl.events import TrainingSample
from online_rl.trainer.samples import Routed, ThumbPairer, anchor_sequences, load_cold_start, route, shard
from tests.conftest import TINY_NAME
from tests.trainer.test_trainer import _pair, _single


def _thumb(i: int, up: bool, model: str = TINY_NAME) -> TrainingSample:
    return _single(_pair(i, random.Random(i), model), [5, 6, 7], 1.0 if up else 0.0, "thumbs", [-1.0] * 3)


def _write(path: Path, samples: list[TrainingSample], extra: str = "") -> Path:
    path.write_text("".join(s.model_dump_json() + "\n" for s in samples) + extra)
    return path


def test_route_sends_pairs_to_dpo_thumbs_to_kto_and_says_why_it_refuses() -> None:
    samples = [_pair(0, random.Random(0)), _thumb(1, True), _pair(2, random.Random(2), "other")]
    routed = route(samples, "auto", TINY_NAME, 2048)
    assert len(routed.pairs) == 1 and routed.thumbs[0][2] is True and routed.trained == 2
    assert [reason for _, reason in routed.unusable] == [
        f"sample of base model 'other'; this trainer trains {TINY_NAME!r}"]
    assert route(samples[:2], "dpo", TINY_NAME, 2048).skipped == 1
    assert "longer than the model's context" in route(samples[:1], "auto", TINY_NAME, 4).unusable[0][1]
    # a token id past the model's vocabulary would index out of its embedding: refused with the reason
    outside = route(samples[:1], "auto", TINY_NAME, 2048, vocab_size=100).unusable
    assert "outside the model's vocabulary (0 to 99)" in outside[0][1]


def test_a_cold_start_file_is_loaded_and_checked_line_by_line(tmp_path: Path) -> None:
    good = [_thumb(i, i % 2 == 0) for i in range(3)]
    assert [s.sample_id for s in load_cold_start(_write(tmp_path / "ok.jsonl", good), "auto", TINY_NAME,
                                                 2048)] == [s.sample_id for s in good]
    with pytest.raises(ConfigError, match=r"trainer.cold_start=.*missing.jsonl does not exist"):
        load_cold_start(tmp_path / "missing.jsonl", "auto", TINY_NAME, 2048)
    with pytest.raises(ConfigError, match=r"bad.jsonl:4: .*each line must be one training sample"):
        load_cold_start(_write(tmp_path / "bad.jsonl", good, '{"sample_id": "x"}\n'), "auto", TINY_NAME, 2048)
    with pytest.raises(ConfigError, match=r"sample s9 cannot be trained: sample of base model 'other'"):
        load_cold_start(_write(tmp_path / "other.jsonl", [_pair(9, random.Random(9), "other")]), "auto",
                        TINY_NAME, 2048)
    with pytest.raises(ConfigError, match=r"has no sample that trainer\.algorithm=dpo trains"):
        load_cold_start(_write(tmp_path / "thumbs.jsonl", good), "dpo", TINY_NAME, 2048)
    # as KL anchors any sample with answer tokens will do, whatever the algorithm trains
    assert len(load_cold_start(_write(tmp_path / "anchors.jsonl", good), "dpo", TINY_NAME, 2048,
                               as_anchors=True)) == 3


def test_anchors_are_every_answer_of_the_cold_start_samples_and_are_split_over_the_workers() -> None:
    pair, thumb = _pair(0, random.Random(0)), _thumb(1, False)
    anchors = anchor_sequences([pair, thumb])
    assert pair.chosen is not None and pair.rejected is not None and thumb.completion is not None
    assert anchors == [(pair.prompt_token_ids, pair.chosen.token_ids),
                       (pair.prompt_token_ids, pair.rejected.token_ids),
                       (thumb.prompt_token_ids, thumb.completion.token_ids)]  # a thumb-down too: no label
    routed = route([_pair(2, random.Random(2))], "auto", TINY_NAME, 2048)
    routed.anchors = anchors
    kept, held = routed.split(lambda sample_id: True)
    assert kept.anchors == anchors and not held.anchors and routed.trained == 1  # anchors are not trained
    shards = shard(routed, 2)
    assert sorted(a for s in shards for a in s.anchors) == sorted(anchors)
    assert all(s.total_anchor_tokens == sum(len(a) for _, a in anchors) for s in shards)


def _thumbs(*rows: tuple[str, list[int], list[int], bool]) -> Routed:
    """A routed batch of thumbs: (sample id, prompt tokens, answer tokens, thumbs-up)."""
    routed = Routed()
    for sample_id, prompt, answer, up in rows:
        routed.thumbs.append((prompt, answer, up))
        routed.thumb_ids.append(sample_id)
    return routed


def test_opposite_thumbs_on_one_prompt_become_a_pair_with_the_liked_answer_chosen() -> None:
    pairer = ThumbPairer(memory=16)
    batch = _thumbs(("down", [1, 2], [7, 8], False), ("other", [3], [9], True), ("up", [1, 2], [5, 6], True),
                    ("same-label", [3], [4], True))
    out = pairer.pair(batch)
    assert out.pairs == [([1, 2], [5, 6], [7, 8])]  # (prompt, chosen: the thumbs-up's, rejected)
    assert out.pair_ids == ["up"] and out.paired_thumb_ids == ["down"]
    # two thumbs-up on one prompt say nothing about which is better: both stay KTO thumbs, and wait
    assert out.thumb_ids == ["other", "same-label"] and len(pairer) == 2
    assert out.sample_ids == {"up", "down", "other", "same-label"} and out.trained == 3


def test_a_thumb_pairs_with_an_opposite_one_of_an_earlier_batch_once() -> None:
    pairer = ThumbPairer(memory=16)
    first = pairer.pair(_thumbs(("early-down", [1, 2], [7, 8], False)))
    assert first.thumb_ids == ["early-down"] and not first.pairs  # trained as a KTO thumb when it came
    later = pairer.pair(_thumbs(("up", [1, 2], [5, 6], True), ("up-again", [1, 2], [4], True)))
    assert later.pairs == [([1, 2], [5, 6], [7, 8])] and later.paired_thumb_ids == ["early-down"]
    assert later.thumb_ids == ["up-again"]  # the earlier thumb is used once
    # the same answer with both labels (two users disagree) is no preference: never paired
    same = pairer.pair(_thumbs(("dup", [1, 2], [4], False)))
    assert not same.pairs and same.thumb_ids == ["dup"]


def test_the_pairer_keeps_the_cold_start_set_out_and_its_memory_bounded() -> None:
    pairer = ThumbPairer(memory=2)
    out = pairer.pair(_thumbs(("cold", [1], [5], True), ("live", [1], [6], False)), exclude={"cold"})
    assert not out.pairs and out.thumb_ids == ["cold", "live"] and len(pairer) == 1  # only "live" waits
    pairer.pair(_thumbs(("b", [2], [5], False), ("c", [3], [5], False)))  # the oldest, "live", is forgotten
    assert len(pairer) == 2
    assert not pairer.pair(_thumbs(("late-up", [1], [7], True))).pairs
    assert pairer.pair(_thumbs(("c-up", [3], [7], True))).paired_thumb_ids == ["c"]
    within = ThumbPairer(memory=0)  # pairs within a batch only
    within.pair(_thumbs(("x", [1], [5], False)))
    assert not within.pair(_thumbs(("y", [1], [6], True))).pairs and len(within) == 0
