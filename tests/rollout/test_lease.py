"""Who runs the rollout: the file lock between processes, and the Kubernetes Lease's protocol against
an in-memory stand-in for the API server's Lease semantics (optimistic concurrency on resourceVersion;
pure logic: the real API server is not part of the test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from online_rl.rollout.lease import FileLease, KubernetesLease


def test_one_process_holds_the_file_lock_and_its_death_frees_it(tmp_path: Path) -> None:
    lock = tmp_path / "controller.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from online_rl.rollout.lease import FileLease\n"
        f"assert FileLease(Path({str(lock)!r}), 'other').acquire()\n"
        "print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        mine = FileLease(lock, "me")
        assert not mine.acquire() and mine.holder() == "other"
        holder.kill()  # SIGKILL: the kernel releases the lock
        holder.wait(10)
        assert mine.acquire() and mine.acquire() and mine.holder() == "me"
        mine.release()
        assert FileLease(lock, "third").acquire()
    finally:
        holder.kill()


class _ApiServer:
    """Leases by name; a write must carry the resourceVersion it read (409 otherwise)."""

    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.away = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.away:
            return httpx.Response(503)
        name = request.url.path.rsplit("/", 1)[-1]
        if request.method == "GET":
            return httpx.Response(200, json=self.leases[name]) if name in self.leases else httpx.Response(404)
        body = json.loads(request.content)
        if request.method == "POST":
            name = body["metadata"]["name"]
            if name in self.leases:
                return httpx.Response(409)
        elif body["metadata"].get("resourceVersion") != self.leases[name]["metadata"]["resourceVersion"]:
            return httpx.Response(409)  # a PUT of what changed since it was read
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        self.leases[name] = body
        return httpx.Response(201 if request.method == "POST" else 200, json=body)


def _lease(server: _ApiServer, identity: str, now: list[float]) -> KubernetesLease:
    return KubernetesLease("orl-rollout-controller", "ml", identity, 15.0, "https://api", "token",
                           clock=lambda: now[0], transport=httpx.MockTransport(server))


def test_a_lease_lapses_by_the_candidates_clock_not_the_holders() -> None:
    """The holder's clock runs an hour behind: its renewTime looks stale, but it renews; a candidate
    judges by when it saw the Lease change, so it does not take a live lease."""
    server, holder_now, now = _ApiServer(), [1_000_000.0 - 3600], [1_000_000.0]
    holder, candidate = _lease(server, "slow-clock", holder_now), _lease(server, "b", now)
    assert holder.acquire() and not candidate.acquire()
    for _ in range(5):
        now[0] += 10
        holder_now[0] += 10
        assert holder.acquire() and not candidate.acquire()
    now[0] += 16  # the holder stopped renewing: lapsed
    assert candidate.acquire()


def test_a_lease_is_held_by_one_renewed_and_taken_over_only_once_it_lapses() -> None:
    server, now = _ApiServer(), [1_000_000.0]
    a, b = _lease(server, "a", now), _lease(server, "b", now)
    assert a.acquire() and not b.acquire()  # created by a; b sees a live holder
    now[0] += 10
    assert a.acquire() and not b.acquire()  # renewed
    now[0] += 14  # 14 s since a's renewal: still a's
    assert not b.acquire()
    now[0] += 2  # 16 s: lapsed
    assert b.acquire()
    spec = server.leases["orl-rollout-controller"]["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    assert not a.acquire()  # a came back: b holds it now; a must stop acting
    server.away = True
    assert not b.acquire()  # the API server away: the holder stops acting too
    server.away = False
    b.release()
    assert a.acquire()  # released: taken at once


def test_two_candidates_racing_for_a_lapsed_lease_get_it_once() -> None:
    server, now = _ApiServer(), [1_000_000.0]
    assert _lease(server, "old", now).acquire()
    read_by_both = json.loads(json.dumps(server.leases["orl-rollout-controller"]))

    def b_view(request: httpx.Request) -> httpx.Response:  # b read the lease before a wrote it
        if request.method == "GET":
            return httpx.Response(200, json=read_by_both)
        return server(request)

    a = _lease(server, "a", now)
    b = KubernetesLease("orl-rollout-controller", "ml", "b", 15.0, "https://api", "token",
                        clock=lambda: now[0], transport=httpx.MockTransport(b_view))
    assert not a.acquire() and not b.acquire()  # both see "old" holding it
    now[0] += 20  # "old" never renewed: lapsed for both
    assert a.acquire()
    assert not b.acquire()  # its write carries the version it read: refused with 409
    assert server.leases["orl-rollout-controller"]["spec"]["holderIdentity"] == "a"
