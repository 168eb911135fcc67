"""Flows: named nodes in order, added, replaced and removed by name; a node can end a pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from online_rl.config import Settings
from online_rl.errors import ConfigError
from online_rl.flow import FlowError
from online_rl.flow.graph import Flow, Step
from online_rl.trainer.flows import Parallel, check_engine, with_layout, with_parallel


def _recorder(seen: list[str], name: str, stop: bool = False):  # type: ignore[no-untyped-def]
    def node(step: Step) -> None:
        seen.append(name)
        step.data[name] = len(seen)
        if stop:
            step.stop()
    return node


def test_nodes_run_in_order_and_hand_on_what_they_made() -> None:
    seen: list[str] = []
    flow = Flow("f", [(n, _recorder(seen, n)) for n in ("score", "update", "publish")])
    flow.add("filter", _recorder(seen, "filter"), after="score")
    flow.add("first", _recorder(seen, "first"), before="score")
    flow.add("last", _recorder(seen, "last"))
    assert flow.names == ["first", "score", "filter", "update", "publish", "last"]
    step = flow.run(Step(number=0))
    assert seen == flow.names
    assert step.data["filter"] == 3 and "_node" not in step.data
    assert all(f"node_{n}_s" in step.metrics and step.metrics[f"node_{n}_s"] >= 0 for n in flow.names)


def test_replace_and_remove_by_name() -> None:
    seen: list[str] = []
    flow = Flow("f", [(n, _recorder(seen, n)) for n in ("a", "b", "c")])
    flow.replace("b", _recorder(seen, "B"))
    flow.remove("c")
    flow.run(Step(number=0))
    assert seen == ["a", "B"] and flow.names == ["a", "b"]


def test_a_node_that_stops_ends_the_pass() -> None:
    seen: list[str] = []
    flow = Flow("f", [("a", _recorder(seen, "a")), ("gate", _recorder(seen, "gate", stop=True)),
                      ("c", _recorder(seen, "c"))])
    step = flow.run(Step(number=0))
    assert seen == ["a", "gate"] and step.stopped_by == "gate"


def test_a_failing_node_raises_and_its_time_is_still_recorded() -> None:
    def broken(step: Step) -> None:
        raise ValueError("boom")

    step = Step(number=0)
    with pytest.raises(ValueError, match="boom"):
        Flow("f", [("broken", broken)]).run(step)
    assert "node_broken_s" in step.metrics


def test_mistakes_name_the_node_and_the_fix() -> None:
    flow = Flow("feedback", [("score", lambda step: None)])
    with pytest.raises(FlowError, match=r"no node 'scor'; its nodes: score"):
        flow.add("x", lambda step: None, after="scor")
    with pytest.raises(FlowError, match="already has a node 'score': use replace"):
        flow.add("score", lambda step: None)
    with pytest.raises(FlowError, match="not callable"):
        flow.add("y", "not a function")  # type: ignore[arg-type]
    with pytest.raises(FlowError, match="not both"):
        flow.add("z", lambda step: None, after="score", before="score")
    with pytest.raises(FlowError, match="kind='offline' is not one of feedback, rollout"):
        Flow("f", kind="offline")


def test_the_layout_is_checked_against_the_flows_engine() -> None:
    with pytest.raises(ConfigError, match=r"Parallel.tp=3 must divide the 4 training devices"):
        Parallel(fsdp=4, tp=3)
    with pytest.raises(ConfigError, match=r"Parallel.dp=0 must be an integer >= 1"):
        Parallel(dp=0)
    with pytest.raises(ConfigError, match=r"data-parallel only .*flow='rollout' for FSDP"):
        check_engine("feedback", None, Parallel(fsdp=2))
    with pytest.raises(ConfigError, match=r"engine='fsdp' does not run the feedback flow.*engine='ddp'"):
        check_engine("feedback", "fsdp", None)
    check_engine("rollout", "fsdp", Parallel(dp=2, fsdp=2, tp=2))
    check_engine("feedback", "ddp", Parallel(dp=2))


def test_the_shorthands_become_the_settings_they_stand_for(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path)
    rollout = with_parallel(settings, "rollout", Parallel(dp=2, fsdp=2, tp=4))
    assert (rollout.hybrid.dp, rollout.hybrid.fsdp, rollout.hybrid.tp) == (2, 2, 4)
    assert rollout.trainer.workers == settings.trainer.workers  # the other flow's section untouched
    assert with_parallel(settings, "feedback", Parallel(dp=3)).trainer.workers == 3
    with pytest.raises(ConfigError, match=r"parallel=\{'workers': 300\}: workers: "):
        with_parallel(settings, "feedback", Parallel(dp=300))
    model = tmp_path / "my-llama"
    model.mkdir()
    (model / "config.json").write_text("{}")
    mine = with_layout(settings, model, None)
    assert (mine.model_dir, mine.model.name) == (model, "my-llama")  # lineage and samples name it so
    assert with_layout(settings, settings.model.name, "fsdp") is settings
    with pytest.raises(ConfigError, match="neither a model folder"):
        with_layout(settings, tmp_path / "nothing-here", None)
    with pytest.raises(ConfigError, match="engine='tpu' is not one of ddp, fsdp"):
        with_layout(settings, None, "tpu")
