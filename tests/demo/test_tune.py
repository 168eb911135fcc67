"""The demo's trainer cadence follows the measured step time."""

from __future__ import annotations

from pathlib import Path

from online_rl.config import Settings
from online_rl.demo.tune import StepTiming, measure_step, tuned
from tests.conftest import TINY_NAME


def _settings(tmp_path: Path, model: Path | None = None) -> Settings:
    return Settings(cache_dir=tmp_path, trainer={"batch_size": 16, "publish_every_samples": 96,  # type: ignore[arg-type]
                                                 "publish_every_s": 120},
                    model={"name": TINY_NAME, "path": model} if model else {})  # type: ignore[arg-type]


def test_a_fast_machine_keeps_the_stated_cadence_and_a_slow_one_gets_smaller_steps(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    fast = tuned(settings, StepTiming(seconds_per_sample=1.2, precision="fp32", threads=1))
    assert fast == {"ORL_TRAINER__BATCH_SIZE": "16", "ORL_TRAINER__PUBLISH_EVERY_SAMPLES": "96",
                    "ORL_TRAINER__PUBLISH_EVERY_S": "120"}
    # five times slower (say bf16 forced on an AVX2-only CPU, or a slow core): steps stay ~30 s, and a
    # version comes every six of them
    slow = tuned(settings, StepTiming(seconds_per_sample=6.0, precision="fp32", threads=1))
    assert slow == {"ORL_TRAINER__BATCH_SIZE": "5", "ORL_TRAINER__PUBLISH_EVERY_SAMPLES": "30",
                    "ORL_TRAINER__PUBLISH_EVERY_S": "180"}
    crawling = tuned(settings, StepTiming(seconds_per_sample=60.0, precision="bf16", threads=1))
    assert crawling["ORL_TRAINER__BATCH_SIZE"] == "4"  # never below 4 samples a step


def test_the_step_is_measured_with_the_real_worker(tmp_path: Path, tiny_model: Path) -> None:
    timing = measure_step(_settings(tmp_path, tiny_model))
    assert 0 < timing.seconds_per_sample < 60 and timing.precision in ("fp32", "bf16") and timing.threads >= 1
