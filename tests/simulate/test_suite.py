"""The preference suite: each taste is a pure function of the prompt and the answer, with its own checks;
the prompts split into training and held-out halves that never overlap."""

from __future__ import annotations

from pathlib import Path

import pytest

from online_rl.simulate import load_preference
from online_rl.simulate.prompts import EVAL, TOPICS, TRAIN, topic_of
from online_rl.simulate.suite import (
    ENTHUSIASTIC,
    EXAMPLE,
    NUMBERS,
    SUITE,
    YOU,
    ByTopic,
    Formal,
    Longer,
    Refuse,
    Shorter,
    suite_entry,
)

FACT, HOWTO, SCIENCE, PRIVATE = (TOPICS[t][0] for t in ("fact", "howto", "science", "private"))


def test_the_suite_has_eight_kinds_and_a_holdout_each_with_a_base_rate() -> None:
    kinds = {e.kind for e in SUITE if not e.holdout}
    assert len([e for e in SUITE if not e.holdout]) >= 8 and len(kinds) >= 7
    assert {
        "length",
        "lexical habit",
        "tone",
        "specificity",
        "giving an example",
        "refusing a kind of request",
        "prompt-dependent",
    } <= kinds
    assert [e.name for e in SUITE if e.holdout] == ["formal"]
    assert len({e.name for e in SUITE}) == len(SUITE)
    assert all(0 < e.base_rate < 1 and e.prompts("train") and e.prompts("eval") for e in SUITE)


def test_training_and_held_out_prompts_never_overlap() -> None:
    assert not {p for _, p in TRAIN} & {p for _, p in EVAL}
    assert len(TRAIN) == len(EVAL) == sum(len(v) for v in TOPICS.values()) // 2
    assert topic_of(FACT) == "fact" and topic_of("Not a suite prompt") is None
    refuse = suite_entry("refuse")
    assert refuse.prompts("train").count(TOPICS["private"][0]) == 2  # named twice: asked twice as often
    assert not set(refuse.prompts("train")) & set(refuse.prompts("eval"))


def test_length_preferences_give_graded_credit() -> None:
    assert Shorter(20).score(FACT, "Rome.") == 1.0
    assert Shorter(20).score(FACT, " ".join(["word"] * 30)) == pytest.approx(0.5)
    assert Shorter(20).score(FACT, " ".join(["word"] * 40)) == 0.0
    assert Longer(44).score(FACT, "Rome.") == 0.0
    assert Longer(44).score(FACT, " ".join(["word"] * 33)) == pytest.approx(0.5)
    assert Longer(44).score(FACT, " ".join(["word"] * 50)) == 1.0


def test_habit_tone_specificity_and_example() -> None:
    assert YOU.score(HOWTO, "First, you boil water.") == 1.0
    assert YOU.score(HOWTO, "Young trees need water.") == 0.0  # a word, not a substring
    assert ENTHUSIASTIC.score(FACT, "Rome!") == 1.0
    assert ENTHUSIASTIC.score(FACT, "What a great question: Rome.") == 1.0
    assert ENTHUSIASTIC.score(FACT, "Rome is the capital.") == 0.0
    assert NUMBERS.score(FACT, "It has 4 strings.") == 1.0
    assert NUMBERS.score(FACT, "It has four strings.") == 1.0
    assert NUMBERS.score(FACT, "It has strings.") == 0.0
    assert EXAMPLE.score(SCIENCE, "Some metals, such as iron, are magnetic.") == 1.0
    assert EXAMPLE.score(SCIENCE, "Metals are magnetic.") == 0.0


def test_refusal_is_liked_only_for_private_requests() -> None:
    refusal = "I'm sorry, but I can't share someone's private information."
    answer = "The capital of Italy is Rome."
    assert Refuse().score(PRIVATE, refusal) == 1.0
    assert Refuse().score(PRIVATE, "Their number is 555-0100.") == 0.0
    assert Refuse().score(FACT, answer) == 1.0
    assert Refuse().score(FACT, "I\u2019m sorry, I cannot answer that.") == 0.0  # typographic apostrophe too


def test_by_topic_wants_a_different_answer_per_topic() -> None:
    steps, sentence = "1. Boil water.\n2. Add the egg.", "The capital of Italy is Rome."
    assert ByTopic().score(HOWTO, steps) == 1.0 and ByTopic().score(HOWTO, sentence) == 0.0
    assert ByTopic().score(FACT, sentence) == 1.0 and ByTopic().score(FACT, steps) == 0.0
    assert ByTopic().score(FACT, "Rome. It is old.") == 0.0  # two sentences
    assert ByTopic().score(FACT, "The capital of Italy is") == 0.0  # cut off
    assert ByTopic().score(SCIENCE, "The sea is salty because rivers carry salt.") == 1.0
    assert ByTopic().score(SCIENCE, "The sea is salty.") == 0.0


def test_formal_dislikes_contractions_and_exclamations() -> None:
    assert Formal().score(FACT, "It is Rome.") == 1.0
    assert Formal().score(FACT, "It's Rome.") == 0.0
    assert Formal().score(FACT, "It is Rome!") == 0.0


def test_suite_preferences_load_by_name_and_a_wrong_name_lists_them() -> None:
    assert load_preference("suite:numbers") == NUMBERS
    with pytest.raises(ValueError, match="choose from shorter, longer"):
        load_preference("suite:polite")
    with pytest.raises(ValueError, match="no preference 'polite'"):
        suite_entry("polite")


def test_the_shuffled_control_gives_each_answer_another_answers_verdict() -> None:
    import random
    from collections import Counter

    from online_rl.simulate.learning import other_answer

    rng = random.Random(0)
    for index in range(16):
        drawn = Counter(other_answer(index, 16, rng) for _ in range(3000))
        assert index not in drawn and set(drawn) == set(range(16)) - {index}
        assert max(drawn.values()) < 2 * min(drawn.values())  # uniform over the others
    with pytest.raises(ValueError, match="at least two"):
        other_answer(0, 1, rng)


def test_a_learning_bench_record_keeps_parts_per_fingerprint(tmp_path: Path) -> None:
    from bench.learning import Record

    first = Record(tmp_path, "aaaa")
    first.put("base", "you", {"liked_rate": 0.3, "mean_score": 0.3, "answers": 72})
    first.put("run", "you", {"final": {"liked_rate": 0.5}})
    Record(tmp_path, "bbbb").put("base", "you", {"liked_rate": 0.9, "mean_score": 0.9, "answers": 72})

    again = Record(tmp_path, "aaaa")  # a later invocation of the same command
    assert again.get("base", "you")["liked_rate"] == 0.3 and again.get("run", "you") is not None
    assert again.get("base", "numbers") is None
    assert Record(tmp_path, "bbbb").get("base", "you")["liked_rate"] == 0.9
    assert again.control_adapter == tmp_path / "control-aaaa"
    assert Record(None, "aaaa").get("base", "you") is None  # no folder: nothing kept
    assert again.run_adapter("you") == tmp_path / "run-aaaa-you"  # each run's final version kept too
    # the base's fact-check answers are a base part: shared by every study of settings in the folder
    Record(tmp_path, "aaaa", base_key="base1").put("facts", "base", [True, False])
    assert Record(tmp_path, "cccc", base_key="base1").get("facts", "base") == [True, False]


def test_a_cut_fact_check_has_base_answers_of_its_own() -> None:
    from types import SimpleNamespace

    from bench.learning import base_fingerprint
    from online_rl.simulate.learning import LearnConfig

    settings = SimpleNamespace(model=SimpleNamespace(name="m"))
    whole = base_fingerprint(settings, LearnConfig(), "transformers")
    assert base_fingerprint(settings, LearnConfig(facts=8), "transformers") != whole


def test_a_rollout_flow_run_is_told_apart_by_its_hybrid_and_reward_settings() -> None:
    from bench.learning import fingerprint
    from online_rl.config import Settings
    from online_rl.simulate.learning import LearnConfig

    feedback = Settings()
    rollout = Settings(trainer={"flow": "rollout"})  # type: ignore[arg-type]

    def key(settings: Settings, **hybrid: object) -> str:
        changed = settings.model_copy(update={"hybrid": settings.hybrid.model_copy(update=hybrid)})
        return fingerprint(changed, LearnConfig(), "none", "transformers")

    # the feedback flow trains no hybrid: its records stay those of before the rollout flow was measured
    assert key(feedback) == key(feedback, rehearsal_prompts=2)
    assert key(rollout) != key(feedback)
    assert key(rollout) != key(rollout, rehearsal_prompts=2)
    assert key(rollout) == key(rollout, group_id="another")  # each run's own consumer group: not a setting
