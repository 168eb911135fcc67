"""An attack simulation on the real stack (issue 23): a client holding a key bound to its own user
tries to steer a live rollout. It poses as 1,000 users at the gateway (to fill other users' caps
or choose its arm) and at the feedback API, and rates the answers other users were served (their
request ids handed to it: the worst case). The rollout's decision and the challenger's measured
reward must not move at all; honest users' own noise sets the scale (the standard error of the
challenger's mean). The control: the same forged thumbs written with the victims' user ids
straight to the feedback topic (what a writer Kafka does not authenticate could do) do move it."""

from __future__ import annotations

import math
import time
import uuid
from contextlib import ExitStack

import httpx
import pytest

from online_rl.events import encode
from online_rl.ingest import new_key
from online_rl.rollout import arm_for
from services.feedback.main import create_app as feedback_app
from tests.factories import thumbs
from tests.services.feedback.conftest import serve
from tests.services.gateway.conftest import Stack, StackFactory, Users

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

FAKE_USERS = 1000


WINDOW_S = 10.0  # the join window: every forged thumb below arrives inside it


def _challenger(stack: Stack) -> tuple[int, float | None]:
    arm = stack.status()["arms"]["challenger"]
    return int(arm["rewards"]), arm["mean_reward"]


def _settled(stack: Stack, quiet_s: float = WINDOW_S + 3,
             timeout_s: float = 90.0) -> tuple[int, float | None]:
    """The challenger's evidence once it stopped changing for `quiet_s` (every open window closed and
    the gateway tallied what came out)."""
    last, since = _challenger(stack), time.monotonic()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _challenger(stack)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return now
    raise AssertionError(f"the evidence kept moving: {stack.status()['arms']}")


def _honest(users: Users) -> tuple[int, float]:
    """The challenger's evidence the honest users' own thumbs make: (answers judged, share of ups)."""
    ups = [up for answer, up in users.judged if answer.arm == "challenger"]
    return len(ups), sum(ups) / len(ups)


def test_a_key_posing_as_a_thousand_users_cannot_move_a_live_rollout(make_stack: StackFactory) -> None:
    # The plan waits for far more evidence than this test gives it: no decision is due, so any
    # change of status or weight during the attack would be the attack's doing.
    stack = make_stack(steps=[0.5, 1.0], min_samples=100_000, max_step_s=3600, window_s=WINDOW_S)
    bad = stack.publish(" no")  # a worse challenger: honest users turn their thumbs down on it
    before = stack.wait(lambda s: s["rollout"] is not None and s["rollout"]["challenger"] == bad
                        and s["rollout"]["status"] == "running")["rollout"]
    users = Users(stack, 30, noise=0.1)
    raw, digest = new_key()
    api = stack.settings.feedback_api.model_copy(update={"api_keys": [f"{digest} feedback user=alice"]})
    with ExitStack() as services:
        services.callback(users.close)
        feedback_url = services.enter_context(serve(feedback_app(stack.settings.model_copy(
            update={"feedback_api": api}), stack.bus)))
        feedback = services.enter_context(httpx.Client(base_url=feedback_url, timeout=30,
                                                       headers={"Authorization": f"Bearer {raw}"}))
        gateway = services.enter_context(httpx.Client(base_url=stack.url, timeout=30,
                                                      headers={"Authorization": f"Bearer {stack.alice_key}"}))

        # 1. At the gateway: alice's key names 1,000 other users (both ways): all refused, so it
        # can neither fill their caps nor pick its arm; its own requests always get alice's arm.
        chat = {"model": "any", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        refused = 0
        for i in range(FAKE_USERS):
            fake = f"fake-{i}"
            got = (gateway.post("/v1/chat/completions", json={**chat, "user": fake}) if i % 2
                   else gateway.post("/v1/chat/completions", json=chat, headers={"X-ORL-User": fake}))
            refused += got.status_code == 403 and got.json()["error"]["code"] == "user_mismatch"
        assert refused == FAKE_USERS
        own = [gateway.post("/v1/chat/completions", json={**chat, "user": "alice"}) for _ in range(5)]
        expected_arm = arm_for(before["rollout_id"], "alice", before["weight"])
        assert {r.status_code for r in own} == {200}
        assert {r.headers["x-orl-arm"] for r in own} == {expected_arm}

        # 2. At the feedback API, inside the window of each round's answers: thumbs up on every
        # answer the challenger gave, as 1,000 users (refused) and as alice (accepted: it is her key's
        # user; but the answers were not served to her, so the join drops them).
        posted: dict[int, int] = {}
        for _ in range(3):
            targets = [a for a in users.round() if a.arm == "challenger" and a.request_id]
            for i in range(FAKE_USERS // 3 + 1):
                target = targets[i % len(targets)]
                body = {"event_id": uuid.uuid4().hex, "request_id": target.request_id,
                        "user_id": f"fake-{i}", "kind": "thumbs", "value": 1}
                code = feedback.post("/v1/feedback", json=body).status_code
                posted[code] = posted.get(code, 0) + 1
            for target in targets:
                body = {"event_id": uuid.uuid4().hex, "request_id": target.request_id, "user_id": "alice",
                        "kind": "thumbs", "value": 1}
                code = feedback.post("/v1/feedback", json=body).status_code
                posted[code] = posted.get(code, 0) + 1
        assert set(posted) == {403, 202} and posted[403] >= FAKE_USERS, posted
        n_honest, reward_honest = _honest(users)
        noise = math.sqrt(max(reward_honest * (1 - reward_honest), 0.01) / n_honest)  # its standard error
        n_seen, reward_seen = _settled(stack)
        # not moved at all: the measured evidence is exactly the honest users' own
        assert n_seen == n_honest and reward_seen == pytest.approx(reward_honest), \
            (noise, stack.status()["arms"])
        after = stack.status()["rollout"]
        assert (after["status"], after["weight"], after["step"]) == \
            ("running", before["weight"], before["step"])

        # 3. The control: the same thumbs with the victims' own user ids, written straight onto the
        # topic (a writer Kafka does not authenticate), inside the window: they move the evidence.
        targets = [a for a in users.round() if a.arm == "challenger" and a.request_id]
        producer = stack.bus.producer()
        for target in targets * 3:  # three ups outweigh the victim's own thumb down
            event = thumbs(target.request_id or "", True, created_at=time.time(), event_id=uuid.uuid4().hex,
                           user_id=target.user)
            producer.produce(stack.topics.feedback, encode(event), (target.request_id or "").encode())
        producer.flush()
        _, reward_forged = _settled(stack)
        _, reward_fair = _honest(users)
        print(f"honest: {n_honest} challenger thumbs, mean {reward_honest:.3f} (standard error {noise:.3f}); "
              f"measured under attack: {n_seen}, {reward_seen}; control (unauthenticated writes): "
              f"{reward_forged} against {reward_fair:.3f}")
        assert reward_forged is not None and reward_forged - reward_fair > 3 * noise, (noise, reward_forged)
