"""The demo's trainer cadence, measured on this machine before the loop starts.

`deploy/local/demo.yaml` states the cadence for a machine that trains a 16-sample step in about 20 s.
A CPU several times slower (or a precision that does not suit it) would make each step outlast the
users' patience and publish versions too rarely to be judged in the demo's budget. So `make demo`
times one training step of the demo's shape first — the real `PolicyWorker.train_step` (KTO on
thumbs, the configured LoRA, `trainer.precision` resolved as the trainer will, the CPUs `up` gives the
trainer) on 8 synthetic thumbs of the users' prompt and answer lengths, after a short warm-up step —
and sets:

- `trainer.batch_size`: as many samples as fit in `TARGET_STEP_S` (between 4 and the configured size);
- `trainer.publish_every_samples`: `VERSIONS_EVERY_BATCHES` batches;
- `trainer.publish_every_s`: the configured value, or `VERSIONS_EVERY_BATCHES` steps' time if longer.

The rollout needs no tuning: its steps end on evidence, whatever the traffic (online_rl/rollout/plan.py).

    python -m online_rl.demo.tune   # prints `export ORL_...=...` lines (demo.sh evaluates them) and, on
                                    # stderr, what it measured
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass

from online_rl.config import Settings, load_settings

__all__ = ["StepTiming", "measure_step", "tuned"]

TARGET_STEP_S = 30.0
VERSIONS_EVERY_BATCHES = 6
_PROMPT_TOKENS, _ANSWER_TOKENS, _SAMPLES = 36, 40, 8  # the demo's chat prompts, answers of <= 48 tokens


@dataclass(frozen=True)
class StepTiming:
    seconds_per_sample: float
    precision: str
    threads: int


def measure_step(settings: Settings) -> StepTiming:
    """Seconds per sample of one training step of the demo's shape (see the module docstring)."""
    import torch

    from online_rl.hardware import model_hidden_size, resolve_precision
    from online_rl.launch.components import threads
    from online_rl.trainer.samples import Routed, shard
    from online_rl.trainer.spec import trainer_specs
    from online_rl.trainer.worker import PolicyWorker

    cpus = max(1, int(threads(settings)[1]))
    torch.set_num_threads(cpus)
    choice = resolve_precision(settings.trainer.precision, "cpu", model_hidden_size(settings.model_dir), cpus,
                               settings.cache_dir, "trainer.precision", log_choice=False)
    policy, _ = trainer_specs(settings)
    worker = PolicyWorker(policy.resolved(choice.precision), cpus)
    rng = random.Random(0)
    ids = lambda n: [rng.randrange(100, 40000) for _ in range(n)]  # noqa: E731
    thumbs = [(ids(_PROMPT_TOKENS), ids(_ANSWER_TOKENS), i % 2 == 0) for i in range(_SAMPLES)]
    work = shard(Routed(thumbs=thumbs), 1)[0]
    worker.train_step(shard(Routed(thumbs=thumbs[:2]), 1)[0])  # warm-up: first-call allocation, dispatch
    start = time.perf_counter()
    worker.train_step(work)
    return StepTiming((time.perf_counter() - start) / _SAMPLES, choice.precision, cpus)


def tuned(settings: Settings, timing: StepTiming) -> dict[str, str]:
    """The ORL_* overrides for this machine (the rule in the module docstring)."""
    trainer = settings.trainer
    batch = max(4, min(trainer.batch_size, int(TARGET_STEP_S / timing.seconds_per_sample)))
    every_s = max(trainer.publish_every_s, VERSIONS_EVERY_BATCHES * batch * timing.seconds_per_sample)
    return {"ORL_TRAINER__BATCH_SIZE": str(batch),
            "ORL_TRAINER__PUBLISH_EVERY_SAMPLES": str(VERSIONS_EVERY_BATCHES * batch),
            "ORL_TRAINER__PUBLISH_EVERY_S": f"{every_s:.0f}"}


def main() -> None:
    settings = load_settings()
    timing = measure_step(settings)
    overrides = tuned(settings, timing)
    batch = int(overrides["ORL_TRAINER__BATCH_SIZE"])
    every = overrides["ORL_TRAINER__PUBLISH_EVERY_SAMPLES"], overrides["ORL_TRAINER__PUBLISH_EVERY_S"]
    print(f"demo tuned for this machine: a training sample takes {timing.seconds_per_sample:.2f} s in "
          f"{timing.precision} on {timing.threads} thread(s): batch {batch} (a step of about "
          f"{batch * timing.seconds_per_sample:.0f} s), a version every {every[0]} samples or {every[1]} s",
          file=sys.stderr)
    for name, value in overrides.items():
        print(f"export {name}={value}")


if __name__ == "__main__":
    main()
