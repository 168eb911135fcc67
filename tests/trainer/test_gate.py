"""The ability gate's pure logic: its probe file, what counts as a correct answer, and the verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from online_rl.demo.anchors import ANCHORS, NEUTRAL_PROMPTS
from online_rl.demo.report import ABILITY_PROMPTS
from online_rl.simulate import PROMPTS
from online_rl.simulate.prompts import TOPICS
from online_rl.trainer.gate import ABILITY_PROBE, ProbeItem, judge, load_probe, probe_correct

PROBE = (ProbeItem("What is the capital of France?", ("paris",)),
         ProbeItem("How many days are in a week?", ("7", "seven")),
         ProbeItem("Who invented the light bulb?", ("edison",)))


def test_the_built_in_probe_shares_no_prompt_or_answer_with_the_users_the_anchors_or_the_check() -> None:
    probe = {item.prompt.lower() for item in ABILITY_PROBE}
    elsewhere = {p.lower() for p in PROMPTS} | {p.lower() for texts in TOPICS.values() for p in texts}
    elsewhere |= {p.lower() for p, _ in ANCHORS} | {p.lower() for p in NEUTRAL_PROMPTS}
    elsewhere |= {p.lower() for p, _ in ABILITY_PROMPTS}
    assert len(probe) == len(ABILITY_PROBE) == 16
    assert not probe & elsewhere
    checked_words = {w for _, words in ABILITY_PROMPTS for w in words if not w.isdigit()}
    assert not checked_words & {w for item in ABILITY_PROBE for w in item.accept}
    assert all(word == word.lower() and word for item in ABILITY_PROBE for word in item.accept)


def test_an_answer_is_correct_when_it_contains_an_accepted_word_in_any_case() -> None:
    answers = ["The capital of France is PARIS.", "A week has seven days.", "Nikola Tesla."]
    assert probe_correct(PROBE, answers) == [True, True, False]
    with pytest.raises(ValueError, match="2 answers for 3 probe prompts"):
        probe_correct(PROBE, answers[:2])


def test_the_verdict_counts_only_what_the_base_got_right_and_allows_the_tolerance() -> None:
    base = [True, True, False]
    kept_all = judge(PROBE, base, [True, True, True], tolerance=0)
    assert kept_all.passed and kept_all.base_correct == 2 and kept_all.correct == 2 and not kept_all.lost
    lost_one = judge(PROBE, base, [True, False, False], tolerance=0)
    assert not lost_one.passed and lost_one.correct == 1 and lost_one.lost == (PROBE[1].prompt,)
    assert judge(PROBE, base, [True, False, False], tolerance=1).passed
    assert not judge(PROBE, base, [False, False, True], tolerance=1).passed  # a new right one does not pay
    assert lost_one.as_metrics() == {"ability_probe_base": 2.0, "ability_probe_kept": 1.0,
                                     "ability_probe_passed": 0.0}
    with pytest.raises(ValueError, match="differ in length"):
        judge(PROBE, base, [True], tolerance=0)


def test_a_probe_file_is_read_and_its_bad_lines_are_named(tmp_path: Path) -> None:
    good = tmp_path / "probe.jsonl"
    good.write_text(json.dumps({"prompt": "Capital of Peru?", "accept": ["Lima"]}) + "\n\n"
                    + json.dumps({"prompt": "2 + 2?", "accept": ["4", "four"]}) + "\n")
    assert load_probe(good) == (ProbeItem("Capital of Peru?", ("lima",)), ProbeItem("2 + 2?", ("4", "four")))
    for line, message in [("{not json", "line 1: not JSON"),
                          (json.dumps({"accept": ["x"]}), "line 1: 'prompt' must be a non-empty string"),
                          (json.dumps({"prompt": "q", "accept": []}), "line 1: 'accept' must be a non-empty"),
                          (json.dumps({"prompt": "q", "accept": "x"}), "'accept' must be a non-empty list"),
                          (json.dumps(["q", ["x"]]), "'prompt' must be"), ("\n", "no prompts")]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(line)
        with pytest.raises(ValueError, match=message):
            load_probe(bad)
