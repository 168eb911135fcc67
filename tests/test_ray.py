"""The Ray runtime: a real local runtime runs remote tasks and actors."""

from __future__ import annotations

import pytest
import ray


@pytest.mark.slow
@pytest.mark.usefixtures("ray_runtime")
def test_remote_task_and_actor_return() -> None:
    @ray.remote
    def square(x: int) -> int:
        return x * x

    @ray.remote
    class Counter:
        def __init__(self) -> None:
            self.n = 0

        def add(self, k: int) -> int:
            self.n += k
            return self.n

    assert ray.get([square.remote(i) for i in range(4)]) == [0, 1, 4, 9]
    counter = Counter.remote()  # type: ignore[attr-defined]
    ray.get(counter.add.remote(2))
    assert ray.get(counter.add.remote(3)) == 5


@pytest.mark.slow
@pytest.mark.usefixtures("ray_runtime")
def test_actors_may_use_every_core_the_driver_may() -> None:
    """With Intel OpenMP preloaded (deploy/local/env.sh, under which the tests run) and torch imported
    before `ray.init`, the raylet started bound to one core and so did every actor it started: two
    actors that should use two cores shared one. `init_ray` gives them the driver's cores back."""
    import os

    import torch  # noqa: F401  (imported before the runtime started, as in every trainer process)

    @ray.remote(num_cpus=0)
    class Probe:
        def cores(self) -> list[int]:
            return sorted(os.sched_getaffinity(0))

    probes = [Probe.remote() for _ in range(2)]  # type: ignore[attr-defined]
    assert ray.get([p.cores.remote() for p in probes]) == [sorted(os.sched_getaffinity(0))] * 2
