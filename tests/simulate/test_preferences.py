"""Preferences and the population's feedback: pure logic."""

from __future__ import annotations

import random

import pytest

from online_rl.simulate import Format, Length, Phrase, Population, load_preference


def test_built_in_preferences_score_what_they_say() -> None:
    assert Phrase("Paris").score("q", "It is paris.") == 1.0 and Phrase("Paris").score("q", "Lyon") == 0.0
    short = Length(4)
    assert [short.score("q", " ".join(["w"] * n)) for n in (2, 4, 6, 8, 12)] == [1.0, 1.0, 0.5, 0.0, 0.0]
    bullets = Format(r"^- ")
    assert bullets.score("q", "Items:\n- one\n- two") == 1.0 and bullets.score("q", "one, two") == 0.0


def test_preferences_load_by_name_or_import_path_and_bad_ones_say_how_to_fix() -> None:
    assert load_preference("phrase:Paris") == Phrase("Paris")
    assert load_preference("length:20") == Length(20)
    assert load_preference("online_rl.simulate.preferences:Phrase:yes") == Phrase("yes")  # a plug-in class
    with pytest.raises(ValueError, match=r"needs an argument, e\.g\. phrase:Paris"):
        load_preference("phrase:")
    with pytest.raises(ValueError, match="invalid literal"):
        load_preference("length:many")
    with pytest.raises(ValueError, match="not a regular expression"):
        load_preference("format:(")
    with pytest.raises(ValueError, match="cannot import no_such_module:Thing"):
        load_preference("no_such_module:Thing")
    with pytest.raises(ValueError, match="gave str, which has no name and score"):
        load_preference("online_rl.simulate.runner:__doc__")


def test_the_population_answers_with_noise_and_some_users_stay_silent() -> None:
    population = Population(Phrase("yes"), users=2000, silent=0.2, noise=0.1, seed=3)
    silent = [u for u in population.ids if population.is_silent(u)]
    assert 0.17 < len(silent) / 2000 < 0.23  # the same users every time (a hash of the id)
    assert silent == [u for u in Population(Phrase("no"), users=2000, silent=0.2, seed=3).ids
                      if Population(Phrase("no"), users=2000, silent=0.2, seed=3).is_silent(u)]
    assert population.judge(silent[0], "q", [("r1", "yes")], random.Random(0)) == []
    talkers = [u for u in population.ids if not population.is_silent(u)]
    rng = random.Random(0)
    ups = [population.judge(u, "q", [(f"r-{u}", "yes yes")], rng)[0] for u in talkers]
    assert {e["kind"] for e in ups} == {"thumbs"} and {e["user_id"] for e in ups} == set(talkers)
    flipped = sum(e["value"] == -1 for e in ups) / len(ups)
    assert 0.07 < flipped < 0.13


def test_ratings_and_pairwise_choices_follow_the_preference() -> None:
    rating = Population(Length(4), kind="rating", noise=0.0, silent=0.0)
    assert rating.judge("u", "q", [("r", "one two")], random.Random(0))[0]["value"] == 5.0
    assert rating.judge("u", "q", [("r", "a b c d e f g h i")], random.Random(0))[0]["value"] == 1.0
    pairwise = Population(Phrase("yes"), kind="pairwise", noise=0.0, silent=0.0)
    [choice] = pairwise.judge("u", "q", [("a", "no"), ("b", "yes")], random.Random(0))
    assert (choice["request_id"], choice["other_request_id"], choice["winner"]) == ("a", "b", "other")
    assert pairwise.judge("u", "q", [("a", "no"), ("b", "nope")], random.Random(0)) == []  # a tie: no choice
    with pytest.raises(ValueError, match="noise in"):
        Population(Phrase("x"), noise=0.9)
