"""The trainer's public shorthands: which flow it runs, on which engine, with which parallel layout.

    from online_rl import Parallel, Trainer

    trainer = Trainer(policy="/models/my-llama", parallel=Parallel(fsdp=2, tp=2), flow="rollout")
    trainer.flow.add("my_eval", my_eval, after="update")
    trainer.run(max_steps=100)

`Parallel(dp, fsdp, tp)` and `engine` are the settings they stand for, checked against the flow: the
`feedback` flow trains on data-parallel policy workers (`engine="ddp"`, `trainer.workers = dp`), the
`rollout` flow on the hybrid engine (`engine="fsdp"`: `hybrid.dp × hybrid.fsdp` devices train under
FSDP and generate tensor-parallel over `hybrid.tp`). `policy` is the base model: a folder holding a
Hugging Face checkpoint, or the embedded default's name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from online_rl.errors import ConfigError
from online_rl.flow.errors import FlowError
from online_rl.flow.graph import Flow

if TYPE_CHECKING:
    from online_rl.config import Settings

__all__ = ["ENGINES", "FlowBuilder", "Parallel", "build_flow", "check_engine", "with_layout",
           "with_parallel"]

FlowBuilder = Callable[[Any], Flow]  # build(trainer) -> Flow
ENGINES = {"feedback": "ddp", "rollout": "fsdp"}  # the engine each built-in flow trains on


@dataclass(frozen=True)
class Parallel:
    """The training layout: `dp` data-parallel replicas, each sharded over `fsdp` devices (FSDP), and
    (the rollout flow) `tp`-way tensor parallelism for generation."""

    dp: int = 1
    fsdp: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "fsdp", "tp"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"Parallel.{name}={value!r} must be an integer >= 1, e.g. 1")
        if (self.dp * self.fsdp) % self.tp:
            raise ConfigError(f"Parallel.tp={self.tp} must divide the {self.dp * self.fsdp} training devices "
                              f"(dp {self.dp} × fsdp {self.fsdp}), e.g. tp=1")


def with_layout(settings: Settings, policy: str | Path | None, engine: str | None) -> Settings:
    """`settings` with `policy` (a model folder, whose name becomes `model.name`, or the configured
    model's name) applied, and `engine` checked."""
    if engine is not None and engine not in ENGINES.values():
        raise ConfigError(f"engine={engine!r} is not one of {', '.join(sorted(ENGINES.values()))}: "
                          "'ddp' trains the feedback flow's data-parallel workers, 'fsdp' the rollout flow's "
                          "hybrid engine")
    if policy is None:
        return settings
    folder = Path(policy).expanduser()
    if folder.resolve() == Path(settings.model_dir).resolve():
        return settings  # the configured model, by its folder
    if (folder / "config.json").is_file():
        return settings.model_copy(update={"model": _changed(settings.model, "policy", path=folder,
                                                             name=folder.resolve().name)})
    if str(policy) != settings.model.name:
        raise ConfigError(f"policy={str(policy)!r} is neither a model folder (holding config.json) nor "
                          f"the configured model {settings.model.name!r}: pass a folder, or set "
                          "model.path")
    return settings


def with_parallel(settings: Settings, kind: str, parallel: Parallel | None) -> Settings:
    """`settings` with `parallel` applied to the section the flow `kind` trains with: `trainer.workers`
    (feedback, data-parallel only) or `hybrid.dp`, `fsdp`, `tp` (rollout)."""
    if parallel is None:
        return settings
    if kind == "feedback":
        check_engine(kind, None, parallel)
        return settings.model_copy(update={"trainer": _changed(settings.trainer, "parallel",
                                                               workers=parallel.dp)})
    return settings.model_copy(update={"hybrid": _changed(settings.hybrid, "parallel", dp=parallel.dp,
                                                          fsdp=parallel.fsdp, tp=parallel.tp)})


def _changed(section: Any, argument: str, **changes: Any) -> Any:
    """`section` with `changes`, validated as the settings are; a refusal names the argument."""
    from pydantic import ValidationError

    try:
        return type(section).model_validate(section.model_dump() | changes)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or argument}: {e['msg']}"
                             for e in exc.errors())
        raise ConfigError(f"{argument}={changes}: {problems}") from exc


def check_engine(kind: str, engine: str | None, parallel: Parallel | None) -> None:
    """Refuse a layout the flow's engine cannot run, naming the argument and the fix."""
    if engine is not None and engine != ENGINES[kind]:
        other = next(k for k, e in ENGINES.items() if e == engine)
        raise ConfigError(f"engine={engine!r} does not run the {kind} flow (it trains on {ENGINES[kind]!r}); "
                          f"use engine={ENGINES[kind]!r}, or flow={other!r} for {engine!r}")
    if kind == "feedback" and parallel is not None and (parallel.fsdp > 1 or parallel.tp > 1):
        raise ConfigError(f"Parallel(fsdp={parallel.fsdp}, tp={parallel.tp}): the feedback flow's workers "
                          "are data-parallel only (engine 'ddp'); use Parallel(dp=N), or flow='rollout' for "
                          "FSDP and tensor parallelism")


def load_builder(target: str) -> FlowBuilder:
    """The function `package.module:function` names (it takes the trainer, returns its Flow)."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"trainer.flow={target!r}: cannot import {module_name!r} ({exc}); make the module "
                          "importable (installed, or on PYTHONPATH)") from exc
    builder: Any = module
    for part in attr.split("."):
        builder = getattr(builder, part, None)
    if not callable(builder):
        raise ConfigError(f"trainer.flow={target!r}: {module_name!r} has no function {attr!r}; name a "
                          "function build(trainer) -> Flow")
    return builder


def build_flow(trainer: Any, flow: str | FlowBuilder) -> Flow:
    """The trainer's flow: a built-in one by name, or what a builder returns."""
    if isinstance(flow, str):
        if flow in ENGINES:
            return trainer.default_flow(flow)
        if ":" not in flow:
            raise ConfigError(f"trainer.flow={flow!r} is not feedback, rollout or 'package.module:function'")
        flow = load_builder(flow)
    built = flow(trainer)
    if not isinstance(built, Flow):
        name = getattr(flow, "__name__", flow)
        raise FlowError(f"the flow builder {name!r} returned {type(built).__name__}, not a Flow: start from "
                        "trainer.default_flow('feedback' or 'rollout') and return it")
    if trainer.kind is None:  # a flow of the user's own nodes only: its kind says which workers to start
        trainer.default_flow(built.kind)
    if built.kind != trainer.kind:
        raise FlowError(f"the flow builder returned a {built.kind} flow but built it from the {trainer.kind} "
                        f"flow's nodes: give Flow(kind={trainer.kind!r})")
    return built
