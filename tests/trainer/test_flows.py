"""The trainer's flows from Python: docs/trainer.md's example run as written on real Kafka, Ray and
MLflow (a node added to the rollout flow changes every step's rewards, and the version is published
with its lineage), and a user's flow builder named in the settings."""

from __future__ import annotations

import random
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from online_rl.bus.kafka import KafkaBus
from online_rl.config import Settings, load_settings
from online_rl.errors import ConfigError
from online_rl.flow import FlowError
from tests.conftest import TINY_NAME
from tests.registry.test_runs import assert_complete_lineage
from tests.trainer.test_trainer import AVOIDED, PREFERRED, _pair, _single, send

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "trainer.md"


def _example() -> str:
    section = PAGE.read_text().split("### Example: a format reward", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code, "docs/trainer.md's flow example lost its python block"
    return code.group(1)


def _environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kafka: str, model: Path) -> Settings:
    """The settings the example reads (from the environment, as the CLI does): the tiny model, a small
    rollout flow that publishes after its second step, fresh topics and MLflow store; on the samples
    topic six pairs and four thumbs, which both teach the reward model."""
    for name, value in {"CACHE_DIR": tmp_path / "cache", "KAFKA__BOOTSTRAP_SERVERS": kafka,
                        "BUS__TOPIC_PREFIX": f"t{uuid.uuid4().hex[:8]}", "MODEL__NAME": TINY_NAME,
                        "MODEL__PATH": model, "HYBRID__ROLLOUT_BATCH": 4, "HYBRID__MAX_NEW_TOKENS": 8,
                        "HYBRID__MIN_PAIRS": 2, "HYBRID__REWARD_STEPS": 1, "HYBRID__PUBLISH_EVERY_STEPS": 2,
                        "HYBRID__LEARNING_RATE": 1e-3}.items():
        monkeypatch.setenv(f"ORL_{name}", str(value))
    settings = load_settings()
    bus = KafkaBus(kafka)
    bus.create_topic(settings.topics.samples, 1)
    bus.create_topic(settings.topics.dlq, 1)
    rng = random.Random(0)
    thumbs = [_single(_pair(100 + i, rng), [PREFERRED if i % 2 else AVOIDED], float(i % 2), "thumbs")
              for i in range(4)]
    send(bus.producer(), settings.topics.samples, [_pair(i, rng) for i in range(6)] + thumbs)
    bus.close()
    return settings


def test_the_documented_flow_example_runs_as_written(
        kafka_bootstrap: str, tiny_model: Path, ray_runtime: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from online_rl.flow.graph import Flow
    from online_rl.tracking import mlflow_client

    code = _example()
    assert len(code.strip().splitlines()) <= 15
    settings = _environment(monkeypatch, tmp_path, kafka_bootstrap, tiny_model)
    seen: list[tuple[list[Any], list[Any]]] = []
    original = Flow.add

    def spy(self: Flow, name: str, node: Any, **where: Any) -> Flow:  # what the example's node did
        if name != "one_sentence":
            return original(self, name, node, **where)

        def watched(step: Any) -> None:
            before = list(step.data["rewards"])
            node(step)
            seen.append((before, list(step.data["rewards"])))
        return original(self, name, watched, **where)

    monkeypatch.setattr(Flow, "add", spy)
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(code, str(PAGE), "exec"), namespace)  # the page's code, as written

    trainer, state = namespace["trainer"], namespace["state"]
    assert trainer.flow.names == ["observe", "reward_model", "generate", "reward", "one_sentence",
                                  "advantage", "update", "log", "publish", "commit"]
    assert state.steps == 2 and len(seen) == 2  # the node ran in each step ...
    for before, after in seen:  # ... and added 0 or 0.5 to every scored rollout's reward
        assert len(before) == len(after) == 4
        assert all((a is None) == (b is None) for a, b in zip(before, after, strict=True))
        assert all(round(a - b, 6) in (0.0, 0.5) for a, b in zip(after, before, strict=True) if b is not None)
    assert "one_sentence" in capsys.readouterr().out  # what the example prints: the flow, steps, versions
    assert len(state.published) == 1
    client = mlflow_client(settings)
    version = client.get_model_version_by_alias(settings.mlflow.registered_model, "challenger")
    assert str(version.version) == state.published[0].version
    from online_rl.registry import read_lineage

    folder = Path(client.download_artifacts(version.run_id, "hybrid", str(tmp_path / "dl")))
    assert_complete_lineage(read_lineage(next(folder.iterdir())), version.tags)
    # the reward model learned from the pairs and from the thumbs
    seen = {key: client.get_metric_history(version.run_id, f"hybrid_reward_{key}_seen")[-1].value
            for key in ("pairs", "thumbs")}
    assert seen == {"pairs": 6.0, "thumbs": 4.0}, seen
    assert client.get_metric_history(version.run_id, "hybrid_reward_thumbs_accuracy")


def test_a_flow_builder_named_in_the_settings_is_loaded_and_checked(
        tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`trainer.flow: module:function` builds the flow from the built-in one; mistakes name the fix."""
    from online_rl.bus.embedded import EmbeddedBus
    from online_rl.trainer import Trainer

    (tmp_path / "my_flows.py").write_text(
        "def short_only(trainer):\n"
        "    flow = trainer.default_flow('feedback')\n"
        "    def drop_long(step):\n"
        "        routed = step.data.get('routed')\n"
        "        if routed is not None:\n"
        "            routed.thumbs = [t for t in routed.thumbs if len(t[1]) <= 64]\n"
        "    return flow.add('drop_long', drop_long, after='score')\n"
        "def not_a_flow(trainer):\n"
        "    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    settings = Settings(cache_dir=tmp_path / "cache", model={"name": TINY_NAME, "path": tiny_model},  # type: ignore[arg-type]
                        trainer={"flow": "my_flows:short_only"})  # type: ignore[arg-type]
    bus = EmbeddedBus(tmp_path / "bus")
    trainer = Trainer(settings, bus)
    assert trainer.kind == "feedback"
    assert trainer.flow.names == ["score", "drop_long", "update", "evaluate", "publish", "checkpoint",
                                  "commit"]
    with pytest.raises(ConfigError, match="has no function 'nope'"):
        Trainer(settings.model_copy(update={"trainer": settings.trainer.model_copy(
            update={"flow": "my_flows:nope"})}), bus)
    with pytest.raises(FlowError, match="returned int, not a Flow"):
        Trainer(settings, bus, flow="my_flows:not_a_flow")
    with pytest.raises(ConfigError, match=r"is not feedback, rollout or 'package\.module:function'"):
        Trainer(settings, bus, flow="offline")
    sys.modules.pop("my_flows", None)
