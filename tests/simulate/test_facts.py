"""The fact check's list and its score, `facts_kept` (pure: no model)."""

from __future__ import annotations

import pytest

from online_rl.demo.anchors import ANCHORS, NEUTRAL_PROMPTS
from online_rl.demo.report import ABILITY_PROMPTS
from online_rl.simulate import PROMPTS
from online_rl.simulate.facts import FACT_CHECK, facts_kept
from online_rl.simulate.prompts import TOPICS
from online_rl.trainer.gate import ABILITY_PROBE


def test_the_fact_check_is_held_out_from_every_prompt_the_loop_trains_gates_or_checks_on() -> None:
    asked = [item.prompt.lower() for item in FACT_CHECK]
    assert len(asked) == len(set(asked)) >= 150  # many facts, each once
    elsewhere = {p.lower() for p in PROMPTS} | {p.lower() for texts in TOPICS.values() for p in texts}
    elsewhere |= {p.lower() for p, _ in ANCHORS} | {p.lower() for p in NEUTRAL_PROMPTS}
    elsewhere |= {p.lower() for p, _ in ABILITY_PROMPTS} | {item.prompt.lower() for item in ABILITY_PROBE}
    assert not set(asked) & elsewhere
    # the same fact is not asked in other words: no check's or probe's answer is among its answers
    # (numbers aside: "four" answers many questions)
    numbers = {"four", "seven", "twelve", "twenty-four"}
    theirs = {w for _, words in ABILITY_PROMPTS for w in words if not w.isdigit() and w not in numbers}
    theirs |= {w for item in ABILITY_PROBE for w in item.accept if not w.isdigit() and w not in numbers}
    assert not theirs & {w for item in FACT_CHECK for w in item.accept}


def test_each_fact_accepts_lower_case_words_its_question_does_not_already_contain() -> None:
    for item in FACT_CHECK:
        assert item.accept and all(w and w == w.lower() for w in item.accept), item
        # an answer that only repeats the question is not counted correct
        assert not any(w in item.prompt.lower() for w in item.accept), item


def test_facts_kept_is_the_share_of_what_the_base_knew_that_the_version_still_knows() -> None:
    base = [True, True, True, True, False]
    assert facts_kept(base, [True, True, True, False, True]) == 0.75  # a fact the base missed does not count
    assert facts_kept(base, [True] * 5) == 1.0
    assert facts_kept(base, [False] * 5) == 0.0
    assert facts_kept([False, False], [True, True]) is None  # the base knew nothing: nothing to keep
    assert facts_kept(base, []) is None  # not measured (a record from before the check)
    with pytest.raises(ValueError, match="3 answers against the base's 5"):
        facts_kept(base, [True] * 3)
