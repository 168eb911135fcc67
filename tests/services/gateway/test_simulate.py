"""Simulated users against the real stack: prompts through the gateway (which version answered is
recorded), feedback through the real feedback API onto the bus, by the declared preference."""

from __future__ import annotations

from collections import Counter

import pytest

from online_rl.events import Feedback, Interaction, decode
from online_rl.ingest import hash_key
from online_rl.simulate import Phrase, Population, simulate
from services.feedback.main import create_app as feedback_app
from tests.conftest import TINY_NAME
from tests.services.feedback.conftest import serve
from tests.services.gateway.conftest import GOOD, StackFactory
from tests.test_cli import _cli

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_simulated_users_chat_and_give_feedback_by_their_preference(make_stack: StackFactory) -> None:
    stack = make_stack(joiner=False, min_samples=10_000)
    version = stack.publish(GOOD)  # says " yes": what these users like
    stack.wait(lambda s: s["rollout"] is not None and s["rollout"]["status"] == "running")
    assert stack.api("POST", "/rollout/promote").status_code == 200
    api = stack.settings.feedback_api.model_copy(
        update={"api_keys": [f"{hash_key(stack.tester_key)} feedback"]})
    settings = stack.settings.model_copy(update={"feedback_api": api})
    with serve(feedback_app(settings, stack.bus)) as feedback_url:
        population = Population(Phrase(GOOD), users=12, silent=0.25, noise=0.0, seed=1)
        result = simulate(stack.url, feedback_url, stack.tester_key, population, requests=30, max_tokens=3,
                          temperature=0.0)
        assert (result.requests, result.failed) == (30, 0)
        served = result.versions[f"policy-v{version}"]
        assert served.answers == 30 and served.mean_score == 1.0  # every answer says what they like

        feedback = [decode(r.value or b"", Feedback) for r in stack.bus.read_all(stack.topics.feedback)]
        talkers = {u for u in population.ids if not population.is_silent(u)}
        assert len(feedback) == served.feedback and {f.user_id for f in feedback} <= talkers
        assert {f.value for f in feedback} == {1.0}  # noise 0: all thumbs up
        logged = {i.request_id: i for i in (decode(r.value or b"", Interaction)
                                            for r in stack.bus.read_all(stack.topics.interactions))}
        assert all(logged[f.request_id].user_id == f.user_id for f in feedback)  # on the user's own answers

        pairs = Population(Phrase(GOOD), users=4, silent=0.0, kind="pairwise", seed=2)
        paired = simulate(stack.url, feedback_url, stack.tester_key, pairs, requests=4, max_tokens=3,
                          temperature=0.0)
        assert paired.versions[f"policy-v{version}"].answers == 8  # two answers per request
        # Both answers say it: a tie, so no choice is posted (users only choose when they can tell).
        assert paired.versions[f"policy-v{version}"].feedback == 0

        shown = _cli("simulate", "--gateway", stack.url, "--feedback", feedback_url, "--requests", "6",
                     "--users", "3", "--preference", "phrase:yes", "--max-tokens", "3", "--temperature", "0",
                     "--json", ORL_SIM_KEY=stack.tester_key)
        assert shown.returncode == 0, shown.stderr
        assert '"failed": 0' in shown.stdout and f'"policy-v{version}"' in shown.stdout
        refused = _cli("simulate", "--preference", "length:many", ORL_SIM_KEY="k")
        assert refused.returncode == 2 and "length:many" in refused.stderr
    assert Counter(i.model for i in logged.values()) == Counter({TINY_NAME: len(logged)})
