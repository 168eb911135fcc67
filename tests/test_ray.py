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
