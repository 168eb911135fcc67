"""Failpoints: named places in the code where a fault test can have the process killed outright.

`failpoint("trainer.after_register")` does nothing unless the environment variable `ORL_FAILPOINTS`
names that point: `ORL_FAILPOINTS=trainer.after_register` kills the process with SIGKILL the first time
it passes there, `trainer.mid_step@3` the third time; several points are separated by commas. SIGKILL
is what a node loss, an OOM kill or `kubectl delete --force` does: no `finally`, no flush, no
handler runs, so whatever the code left half done stays half done. The chaos tests (tests/trainer/
test_kill_points.py, bench/chaos.py) restart the process without the variable and check what it
recovered.

The points, in the order a trainer step passes them (docs/reliability.md):

- `trainer.mid_step`: the update ran on the workers, nothing of it recorded or durable yet;
- `trainer.before_publish`: the publish's write-ahead checkpoint is durable, nothing is in MLflow;
- `registry.after_register`: the version is registered, the `challenger` alias not yet moved;
- `trainer.after_publish`: the version and its alias are in MLflow, the step's checkpoint not written;
- `checkpoint.mid_write`: the checkpoint's files are half written in their staging folder;
- `trainer.before_commit`: the checkpoint is durable, the batch's offsets not committed to Kafka.

And in the joiner's transaction:

- `joiner.mid_transaction`: the step's samples, changelog and dead letters are produced, not committed;
- `joiner.after_commit`: the transaction is committed, the step not yet returned.

In serving (the inference replica and the gateway's rollout controller):

- `serving.mid_load`: a replica's hot swap has the version's files on disk, the engine not yet loaded;
- `rollout.after_state_write`: the gateway saved a decision to its state file, neither its audit line
  nor MLflow's aliases are written;
- `rollout.mid_mlflow`: a promotion moved MLflow's `champion` alias; `challenger` and the tags not yet.
"""

from __future__ import annotations

import logging
import os
import signal

__all__ = ["ENV", "POINTS", "failpoint"]

logger = logging.getLogger(__name__)

ENV = "ORL_FAILPOINTS"
POINTS = ("trainer.mid_step", "trainer.before_publish", "registry.after_register", "trainer.after_publish",
          "checkpoint.mid_write", "trainer.before_commit", "joiner.mid_transaction", "joiner.after_commit",
          "serving.mid_load", "rollout.after_state_write", "rollout.mid_mlflow")
_hits: dict[str, int] = {}


def _armed() -> dict[str, int]:
    """The points `ORL_FAILPOINTS` names, each with the hit that kills (1 = the first)."""
    armed: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in os.environ.get(ENV, "").split(","))):
        point, _, nth = item.partition("@")
        if point not in POINTS:
            raise ValueError(f"{ENV} names {point!r}, which is not a failpoint; the points are "
                             f"{', '.join(POINTS)}")
        try:
            armed[point] = int(nth) if nth else 1
        except ValueError:
            raise ValueError(f"{ENV}: {item!r} should be POINT or POINT@N (N: which hit kills)") from None
    return armed


def failpoint(name: str) -> None:
    """SIGKILL this process here when `ORL_FAILPOINTS` arms `name` for this hit; otherwise nothing."""
    if ENV not in os.environ:
        return
    armed = _armed()
    if name not in armed:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == armed[name]:
        logger.warning("failpoint %s: killing this process (SIGKILL)", name,
                       extra={"event": "failpoint", "point": name})
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
