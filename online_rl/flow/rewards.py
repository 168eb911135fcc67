"""Rewards written as code: what a reward function is (`RewardFunctionSpec`), how its target is loaded,
and the rule that combines the sources of reward into one number per rollout (`RewardRule`, `combine`).

The sources are users' feedback (`"feedback"`), the learned reward model (`"reward_model"`) and each
reward function, by its name. `combine` is a pure function of their scores. This module never calls a
reward function: `online_rl.flow.functions` does, out of the trainer's process. It knows nothing about
Ray or the bus.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict, Field, field_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from online_rl.flow.errors import FlowError, RewardFunctionError, RewardRuleError

__all__ = [
    "FEEDBACK",
    "REWARD_MODEL",
    "RewardFn",
    "RewardFunctionSpec",
    "RewardRule",
    "combine",
    "load_reward_function",
]

FEEDBACK = "feedback"
REWARD_MODEL = "reward_model"
_BUILT_IN = (FEEDBACK, REWARD_MODEL)  # every other source is a reward function's name
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_TARGET = re.compile(rf"^{_DOTTED}:{_DOTTED}$")

# (prompt, completion, meta) -> float, or batched (prompts, completions, metas) -> list[float]; either
# may be `async def`.
RewardFn = Callable[..., Any]


@pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class RewardFunctionSpec:
    """One reward function: where it lives, how it is called and how it counts."""

    name: str = Field(description="The function's source name: in the rule, the metrics and dead letters.")
    target: str = Field(
        description="'package.module:function' (or 'module:Class.method'), importable where Ray runs it: "
        "an installed package, or a folder on the Ray workers' PYTHONPATH.")
    weight: float = Field(
        default=1.0, ge=0, allow_inf_nan=False,
        description="Its weight in the weighted sum; 0: it only gates (see `gate`), it adds nothing.")
    batched: bool = Field(
        default=False, description="Called once per batch with lists (prompts, completions, metas), "
        "returning one number per row; else once per row with (prompt, completion, meta).")
    timeout_s: float = Field(
        default=10.0, gt=0, le=3600,
        description="The longest one call may take (a batched call: the whole batch; else one row); "
        "past it the call's rows fail and the actor that runs the functions is replaced.")
    gate: float | None = Field(
        default=None, allow_inf_nan=False,
        description="A row whose score from this function is below the gate gets the rule's gate_failed "
        "reward, whatever the other sources say; empty: no gate.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if name in _BUILT_IN:
            raise ValueError(f"{name!r} is the name of a built-in source; call the function something else")
        if not _NAME.match(name):
            raise ValueError(f"{name!r} is not a source name: use up to 64 letters, digits, '_', '.' or '-', "
                             "starting with a letter, e.g. 'format'")
        return name

    @field_validator("target")
    @classmethod
    def _check_target(cls, target: str) -> str:
        if not _TARGET.match(target):
            raise ValueError(f"{target!r} is not 'package.module:function'; write e.g. "
                             "'my_rewards.format:has_answer_tag'")
        return target


def load_reward_function(target: str, field: str = "target") -> RewardFn:
    """Import `module:attr` (attr may be dotted, `module:Class.method`) and return the callable.

    Runs the module's import-time code, so call it where the functions run (the reward actor), not in
    the trainer. Raises `RewardFunctionError` naming `field` and the fix."""
    if not _TARGET.match(target):
        raise RewardFunctionError(f"{field}: {target!r} is not 'package.module:function'; write e.g. "
                                  "'my_rewards.format:has_answer_tag'")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise RewardFunctionError(
                f"{field}: no module named {exc.name!r} (from {target!r}); install it, or put its folder on "
                "the PYTHONPATH of the processes Ray starts") from exc
        raise RewardFunctionError(f"{field}: importing {module_name!r} failed: {exc}; install what it "
                                  "imports") from exc
    except (Exception, SystemExit) as exc:  # its import-time code is the user's: anything may happen
        raise RewardFunctionError(f"{field}: importing {module_name!r} raised {type(exc).__name__}: {exc}; "
                                  "fix the module") from exc
    found: Any = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError as exc:
            raise RewardFunctionError(f"{field}: module {module_name!r} has no attribute {attr!r}; check "
                                      "the name after the colon") from exc
    if not callable(found):
        raise RewardFunctionError(f"{field}: {target!r} is a {type(found).__name__}, not a function; point "
                                  "it at a function (prompt, completion, meta) -> float")
    return found


@dataclass(frozen=True)
class RewardRule:
    """How the sources' scores make one reward per row: gates first, then a weighted sum."""

    weights: Mapping[str, float] = field(metadata={
        "help": "Weight per source ('feedback', 'reward_model', or a function's name); 0: the source only "
        "gates. When a row lacks some sources, the others' weights are scaled up to the same total."})
    gates: Mapping[str, float] = field(default_factory=dict, metadata={
        "help": "Minimum score per source: a row below any of them gets `gate_failed`."})
    gate_failed: float = field(default=0.0, metadata={"help": "The reward of a row that fails a gate."})

    def __post_init__(self) -> None:
        for what, table in (("weights", self.weights), ("gates", self.gates)):
            for source, value in table.items():
                if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                    raise RewardRuleError(f"{what}[{source!r}] = {value!r}: write a finite number")
        if any(w < 0 for w in self.weights.values()):
            raise RewardRuleError(f"weights {dict(self.weights)}: a weight is >= 0 (a penalty is a function "
                                  "that returns negative scores)")
        if not any(w > 0 for w in self.weights.values()):
            raise RewardRuleError("weights: no source has a weight above 0; give at least one, e.g. "
                                  "{'reward_model': 1.0}")
        if not math.isfinite(self.gate_failed):
            raise RewardRuleError(f"gate_failed = {self.gate_failed}: write a finite number, e.g. 0")
        object.__setattr__(self, "weights", dict(self.weights))  # a copy: the caller's dict may change
        object.__setattr__(self, "gates", dict(self.gates))

    @property
    def sources(self) -> tuple[str, ...]:
        """Every source the rule reads: weighted ones, then gated ones."""
        return tuple(dict.fromkeys([*self.weights, *self.gates]))

    @classmethod
    def from_specs(cls, specs: Sequence[RewardFunctionSpec], weights: Mapping[str, float] | None = None,
                   gate_failed: float = 0.0) -> RewardRule:
        """The rule of these functions (their weights and gates) next to the built-in sources' `weights`
        (default: the reward model alone, weight 1)."""
        built_in = {REWARD_MODEL: 1.0} if weights is None else dict(weights)
        for source in built_in:
            if source not in _BUILT_IN:
                raise RewardRuleError(f"weights.{source}: only {' and '.join(_BUILT_IN)} are weighted here; "
                                      "a function's weight is its own `weight`")
        names: dict[str, int] = {}
        for index, spec in enumerate(specs):
            if spec.name in names:
                raise RewardRuleError(f"functions[{index}].name {spec.name!r} is also functions"
                                      f"[{names[spec.name]}]'s; give each function its own name")
            names[spec.name] = index
        return cls(weights={**built_in, **{s.name: s.weight for s in specs}},
                   gates={s.name: s.gate for s in specs if s.gate is not None}, gate_failed=gate_failed)


def combine(rule: RewardRule, scores: Mapping[str, Sequence[float | None]]) -> list[float | None]:
    """One reward per row from each source's scores (None, or a non-finite number: no score).

    1. Gates: a row with a gated score below its gate gets `rule.gate_failed`; a row missing a gated
       score (and failing none) cannot be judged and gets None.
    2. The weighted sum of the row's scores; when some weighted sources lack a score, the others'
       weights are scaled up to the rule's total weight. A row with no weighted score gets None.

    Every source the rule names must be in `scores` (use None for the rows it has no score for), with
    as many rows as the others; sources the rule does not name are ignored."""
    absent = [source for source in rule.sources if source not in scores]
    if absent:
        raise FlowError(f"no scores for {absent}; pass every source the rule names, with None for the rows "
                        "it did not score")
    lengths = {source: len(scores[source]) for source in rule.sources}
    if len(set(lengths.values())) > 1:
        raise FlowError(f"the sources scored different numbers of rows: {lengths}; pass one entry per row")
    rows = next(iter(lengths.values()))
    total = sum(rule.weights.values())
    return [_combine_row(rule, scores, row, total) for row in range(rows)]


def _score(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _combine_row(rule: RewardRule, scores: Mapping[str, Sequence[float | None]], row: int,
                 total: float) -> float | None:
    gated = [(_score(scores[source][row]), floor) for source, floor in rule.gates.items()]
    if any(value is not None and value < floor for value, floor in gated):
        return rule.gate_failed
    if any(value is None for value, _ in gated):
        return None
    present = [(weight, value) for source, weight in rule.weights.items()
               if weight > 0 and (value := _score(scores[source][row])) is not None]
    if not present:
        return None
    return sum(w * v for w, v in present) * (total / sum(w for w, _ in present))
