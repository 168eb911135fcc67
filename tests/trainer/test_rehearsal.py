"""Fact rehearsal (online_rl/trainer/rehearsal.py): the built-in set stays out of everything that
measures forgetting, the pairs are right over wrong on the same prompt, the sampling is seeded and
leaves training's random stream alone, and a trainer on a real Kafka broker, MLflow store and Ray
runtime mixes the pairs into its steps without counting them as users' samples."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from online_rl.config import Settings, TrainerConfig
from online_rl.demo.anchors import ANCHORS, NEUTRAL_PROMPTS
from online_rl.demo.report import ABILITY_PROMPTS
from online_rl.simulate.facts import FACT_CHECK
from online_rl.simulate.prompts import TOPICS
from online_rl.trainer.gate import ABILITY_PROBE, ProbeItem
from online_rl.trainer.rehearsal import REHEARSAL_SET, draw_prompts, edit_fact, edited_pairs, rehearsal_pairs
from online_rl.trainer.spec import trainer_specs
from online_rl.trainer.worker import PolicyWorker
from tests.conftest import TINY_NAME


def test_the_built_in_set_shares_no_prompt_or_answer_with_what_measures_forgetting() -> None:
    prompts = [item.prompt for item in REHEARSAL_SET]
    assert len(prompts) == len(set(prompts)) == 35
    held = ({i.prompt for i in ABILITY_PROBE} | {i.prompt for i in FACT_CHECK}
            | {p for p, _ in ABILITY_PROMPTS} | {p for p, _ in ANCHORS} | set(NEUTRAL_PROMPTS)
            | {p for texts in TOPICS.values() for p in texts})
    assert not set(prompts) & held
    # nor does a rehearsed answer teach the 8-prompt check or the gate's probe their own answers
    checked = {w for i in ABILITY_PROBE for w in i.accept} | {w for _, a in ABILITY_PROMPTS for w in a}
    assert not {w for i in REHEARSAL_SET for w in i.accept} & checked
    assert all(item.accept and all(w == w.lower() for w in item.accept) for item in REHEARSAL_SET)


def test_each_step_draws_its_own_prompts_the_same_after_a_restart() -> None:
    first = draw_prompts(35, 4, seed=0, step=1)
    assert len(set(first)) == 4 and all(0 <= i < 35 for i in first)
    assert draw_prompts(35, 4, seed=0, step=1) == first  # a resumed trainer asks the same
    assert {tuple(draw_prompts(35, 4, 0, step)) for step in range(1, 9)} != {tuple(first)}
    assert draw_prompts(35, 4, seed=1, step=1) != first
    assert sorted(draw_prompts(3, 8, 0, 1)) == [0, 1, 2]  # more asked than the set holds: each once


def test_a_pair_is_a_right_answer_over_a_wrong_one_to_the_same_prompt() -> None:
    items = [ProbeItem("What is the capital of Kenya?", ("nairobi",)),
             ProbeItem("What is the opposite of hot?", ("cold",)),
             ProbeItem("How many days are in a week?", ("7", "seven"))]
    prompts = [[1, 2], [3, 4], [5, 6]]
    answers = [
        [([10], "It is Mombasa."), ([11], "Nairobi, of course!"), ([12], "Nairobi.")],  # mixed
        [([20], "Cold."), ([21], "COLD")],  # all right: nothing to prefer
        [([30], "Eight."), ([31], "Six.")],  # all wrong: no right answer to prefer
    ]
    draw = rehearsal_pairs(items, prompts, answers)
    assert draw.pairs == [([1, 2], [11], [10])]
    assert (draw.asked, draw.answers, draw.correct) == (3, 7, 4)
    assert draw.as_metrics() == {"rehearsal_pairs": 1.0, "rehearsal_correct": pytest.approx(4 / 7)}
    with pytest.raises(ValueError, match="3 prompts, 2 prompt encodings"):
        rehearsal_pairs(items, prompts[:2], answers)


def test_an_edited_pair_differs_from_the_right_answer_in_the_fact_alone() -> None:
    assert edit_fact("The capital of Iraq is Baghdad. Baghdad is old.", ("baghdad",), "abuja") == \
        "The capital of Iraq is Abuja. Abuja is old."
    assert edit_fact("A week has 7 days, not 17.", ("7", "seven"), "12") == "A week has 12 days, not 17."
    assert edit_fact("BAGHDAD!", ("baghdad",), "beirut") == "BEIRUT!"
    assert edit_fact("It is Mosul.", ("baghdad",), "beirut") is None

    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]

    items = [ProbeItem("What is the capital of Iraq?", ("baghdad",)),
             ProbeItem("What is the capital of Nepal?", ("kathmandu",)),
             ProbeItem("What is the opposite of hot?", ("cold",)),
             ProbeItem("How many days are in a week?", ("7", "seven"))]
    answers = [
        [([5], "It is Mosul."), ([6, 2], "Baghdad, of course!")],  # a right one: the pair, ended
        [([7], "KATHMANDU")],  # right, did not end (no end-of-sequence token)
        [([8], "Warm, I think.")],  # only wrong: nothing to edit
        [([9], "Seven days.")],
    ]
    pool = [*items, ProbeItem("What is 3 times 4?", ("12", "twelve"))]
    draw = edited_pairs(items, [[1], [2], [3], [4]], answers, pool, encode, 2, random.Random(0))
    assert (draw.asked, draw.answers, draw.correct) == (4, 5, 3)
    texts = [("".join(map(chr, c)), "".join(map(chr, r))) for _, c, r in draw.pairs]
    # a capital is swapped for a capital (the prompts of the same form); the end token kept on both
    assert texts[0] == ("Baghdad, of course!\x02", "Kathmandu, of course!\x02")
    assert texts[1] == ("KATHMANDU", "BAGHDAD")
    # a number only for a number, spelled as the answer spelled it
    assert texts[2] == ("Seven days.", "Twelve days.")
    assert [p for p, _, _ in draw.pairs] == [[1], [2], [4]]
    week = [[([9], "A week has 7 days.")]]
    digits = edited_pairs(items[3:], [[4]], week, pool, encode, 2, random.Random(0))
    assert ["".join(map(chr, r)) for _, _, r in digits.pairs] == ["A week has 12 days."]
    # with no other number in the pool the numeric fact makes no pair (it would teach "no number")
    alone = edited_pairs(items[3:], [[4]], week, items, encode, 2, random.Random(0))
    assert alone.pairs == [] and alone.correct == 1


def test_rehearsal_needs_an_algorithm_that_trains_pairs() -> None:
    with pytest.raises(ValidationError, match=r"trainer\.rehearsal_prompts=4 adds DPO pairs.*algorithm=auto"):
        TrainerConfig(rehearsal_prompts=4, algorithm="kto")
    assert TrainerConfig(rehearsal_prompts=4, algorithm="dpo").rehearsal_samples == 4
    with pytest.raises(ValidationError, match="rehearsal_samples"):
        TrainerConfig(rehearsal_prompts=4, rehearsal_samples=1)


def test_sampled_answers_are_seeded_and_leave_the_training_stream_alone(tiny_model: Path) -> None:
    settings = Settings(model={"name": TINY_NAME, "path": tiny_model},  # type: ignore[arg-type]
                        trainer={"precision": "fp32"})  # type: ignore[arg-type]
    worker = PolicyWorker(trainer_specs(settings)[0])
    prompts = [[1, 500, 600, 2], [1, 700, 2]]
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = worker.answer_sampled(prompts, 3, 8, 0, 2, 1.0, seed=7)
    assert torch.equal(torch.get_rng_state(), before)  # dropout draws what a run without rehearsal would
    assert [len(group) for group in first] == [3, 3]
    assert all(1 <= len(a) <= 8 and (len(a) == 8 or a[-1] == 2) for group in first for a in group)
    assert worker.answer_sampled(prompts, 3, 8, 0, 2, 1.0, seed=7) == first
    assert worker.answer_sampled(prompts, 3, 8, 0, 2, 1.0, seed=8) != first
    assert len({tuple(a) for group in first for a in group}) > 1  # sampled, not greedy


@pytest.mark.slow
@pytest.mark.kafka
def test_a_trainer_rehearses_facts_beside_its_users_samples(
    kafka_bootstrap: str, embedded_model: Path, ray_runtime: None, tmp_path: Path
) -> None:
    from online_rl.tracking import mlflow_client
    from online_rl.trainer import Trainer
    from tests.trainer.test_trainer import _kafka_topics, _pair, send

    settings = Settings(
        cache_dir=tmp_path / "cache",
        kafka={"bootstrap_servers": kafka_bootstrap},  # type: ignore[arg-type]
        model={"path": embedded_model},  # type: ignore[arg-type]
        bus={"topic_prefix": f"r{uuid.uuid4().hex[:8]}"},  # type: ignore[arg-type]
        mlflow={"registered_model": "rehearsed"},  # type: ignore[arg-type]
        trainer={"batch_size": 8, "batch_timeout_s": 1.0, "precision": "fp32",  # type: ignore[arg-type]
                 "publish_every_samples": 16, "publish_every_s": 3600, "ability_gate": False,
                 "rehearsal_prompts": 6, "rehearsal_samples": 4, "ability_max_tokens": 24,
                 "checkpoint_dir": tmp_path / "ckpt"},
    )
    bus, topics = _kafka_topics(settings, partitions=1)
    send(bus.producer(), topics.samples, [_pair(i, random.Random(i), settings.model.name) for i in range(16)])
    trainer = Trainer(settings, bus)
    state = trainer.run(idle_exit_s=8.0)
    bus.close()
    assert state.step == 2 and state.samples == 16  # the rehearsal pairs are not users' samples
    assert [v.version for v in trainer.published] == ["1"]
    client = mlflow_client(settings)
    pairs = [m.value for m in client.get_metric_history(trainer.mlflow_run.run_id, "rehearsal_pairs")]
    correct = [m.value for m in client.get_metric_history(trainer.mlflow_run.run_id, "rehearsal_correct")]
    # the embedded model answers these prompts right some of the time at temperature 1: both kinds
    # of answer, so pairs formed, and at most one per prompt asked
    assert len(pairs) == 2 and sum(pairs) >= 1 and all(p <= 6 for p in pairs)
    assert len(correct) == 2 and all(0 < c < 1 for c in correct)
