"""Calling reward functions out of the trainer's process.

`RewardFunctionsActor` is a Ray actor: it imports the functions, calls them on the rows it is sent and
turns what each returns or raises into a score or a reason. `RewardFunctions`, on the trainer's side,
sends it the batches with a deadline per call, so that nothing a function does can raise out of
`score`, and no call can hold it past the function's `timeout_s`:

- an exception costs only the rows it was raised on (a batched call that raises is retried row by row);
- a hang or a crash costs the call's rows and the actor, which is killed and replaced before the next
  call; the function's further rows in that batch are not called (one timeout per function per batch);
- a non-number, a non-finite number or the wrong count of numbers fails the rows it was returned for.

Knows nothing about the rule that combines the scores, nor about the bus.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import reprlib
import traceback
from collections.abc import Awaitable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from online_rl.errors import OnlineRLError
from online_rl.flow.errors import FlowError, RewardFunctionError
from online_rl.flow.rewards import RewardFn, RewardFunctionSpec, load_reward_function

__all__ = ["Failure", "RewardFunctions", "RewardFunctionsActor", "RewardScores"]

logger = logging.getLogger(__name__)
_GRACE_S = 1.0  # async per-row functions: the actor times each row out itself; the driver waits this longer
Row = tuple[float | None, str | None]  # a score, or None and why


@dataclass(frozen=True)
class Failure:
    """A row one function could not score, and why."""

    row: int
    name: str
    reason: str


@dataclass(frozen=True)
class RewardScores:
    """Each function's score per row (None where it failed), and the failures."""

    values: dict[str, list[float | None]]
    failures: list[Failure]


@dataclass(frozen=True)
class _Loaded:
    problems: list[str]
    concurrent: list[str]  # async per-row functions: the actor awaits a batch's rows together


@dataclass(frozen=True)
class _Outcome:
    values: list[float | None]
    reasons: list[str | None]
    raised: bool = False  # the whole call raised (a batched call is then retried row by row)


class RewardFunctionsActor:
    """Runs in a Ray worker process: imports the functions, calls them, checks what they return."""

    def __init__(self, specs: Sequence[RewardFunctionSpec]) -> None:
        self._specs = list(specs)
        self._functions: dict[str, RewardFn] = {}
        self._loop = asyncio.new_event_loop()

    def load(self) -> _Loaded:
        """Import every function; say which could not be."""
        problems = []
        for index, spec in enumerate(self._specs):
            try:
                self._functions[spec.name] = load_reward_function(spec.target,
                                                                  f"rewards.functions[{index}].target")
            except RewardFunctionError as exc:
                problems.append(f"{exc} (function {spec.name!r})")
        concurrent = [spec.name for spec in self._specs if spec.name in self._functions and not spec.batched
                      and _is_async(self._functions[spec.name])]
        return _Loaded(problems, concurrent)

    def call(self, name: str, prompts: list[str], completions: list[str],
             metas: list[dict[str, Any]]) -> _Outcome:
        spec = next(spec for spec in self._specs if spec.name == name)
        function = self._functions[name]
        if spec.batched:
            return self._batched(spec, function, prompts, completions, metas)
        if _is_async(function):
            rows = self._loop.run_until_complete(
                _gather(function, spec.timeout_s, prompts, completions, metas))
        else:
            rows = [self._row(spec, function, *row) for row in zip(prompts, completions, metas, strict=True)]
        return _Outcome([value for value, _ in rows], [reason for _, reason in rows])

    def _row(self, spec: RewardFunctionSpec, function: RewardFn, prompt: str, completion: str,
             meta: dict[str, Any]) -> Row:
        try:
            result = function(prompt, completion, meta)
            if inspect.isawaitable(result):
                result = self._await(result, spec.timeout_s)
        except TimeoutError:
            return None, f"timed out after {spec.timeout_s:g} s"
        except (Exception, SystemExit) as exc:
            return None, _raised(exc)
        return _as_score(result)

    def _batched(self, spec: RewardFunctionSpec, function: RewardFn, prompts: list[str],
                 completions: list[str], metas: list[dict[str, Any]]) -> _Outcome:
        n = len(prompts)
        try:
            result = function(list(prompts), list(completions), list(metas))
            if inspect.isawaitable(result):
                result = self._await(result, spec.timeout_s)
        except TimeoutError:
            return _Outcome([None] * n, [f"timed out after {spec.timeout_s:g} s"] * n)
        except (Exception, SystemExit) as exc:
            return _Outcome([None] * n, [_raised(exc)] * n, raised=True)
        if isinstance(result, str | bytes | Mapping) or result is None:
            return _Outcome([None] * n, [f"returned {_show(result)}, not a list of {n} numbers"] * n)
        try:
            items = list(result)
        except Exception:
            return _Outcome([None] * n, [f"returned {_show(result)}, not a list of {n} numbers"] * n)
        if len(items) != n:
            reason = f"returned {len(items)} scores for {n} rows; return one per row"
            return _Outcome([None] * n, [reason] * n)
        rows = [_as_score(item) for item in items]
        return _Outcome([value for value, _ in rows], [reason for _, reason in rows])

    def _await(self, awaitable: Awaitable[Any], timeout: float) -> Any:
        async def wait() -> Any:
            return await asyncio.wait_for(_resolve(awaitable), timeout)

        return self._loop.run_until_complete(wait())


async def _resolve(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


async def _gather(function: RewardFn, timeout: float, prompts: list[str], completions: list[str],
                  metas: list[dict[str, Any]]) -> list[Row]:
    async def one(row: int) -> Any:
        return await asyncio.wait_for(function(prompts[row], completions[row], metas[row]), timeout)

    results = await asyncio.gather(*(one(row) for row in range(len(prompts))), return_exceptions=True)
    return [(None, f"timed out after {timeout:g} s") if isinstance(result, TimeoutError)
            else (None, _raised(result)) if isinstance(result, BaseException)
            else _as_score(result) for result in results]


def _is_async(function: RewardFn) -> bool:
    method = type(function).__call__ if not inspect.isroutine(function) else None  # a callable object
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(method)


def _show(value: Any) -> str:
    try:
        return f"{type(value).__name__} {reprlib.repr(value)}"
    except Exception:
        return type(value).__name__


def _raised(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"raised {type(exc).__name__}: {str(exc)[:300]}{where}"


def _as_score(value: Any) -> Row:
    if isinstance(value, str | bytes) or value is None:
        return None, f"returned {_show(value)}, not a number"
    try:
        number = float(value)
    except Exception:
        return None, f"returned {_show(value)}, not a number"
    if not math.isfinite(number):
        return None, f"returned {number}, not a finite number"
    return number, None


@dataclass(frozen=True)
class _Rows:
    prompts: list[str]
    completions: list[str]
    metas: list[dict[str, Any]]

    def take(self, rows: list[int]) -> tuple[list[str], list[str], list[dict[str, Any]]]:
        return ([self.prompts[r] for r in rows], [self.completions[r] for r in rows],
                [self.metas[r] for r in rows])


class RewardFunctions:
    """The trainer's handle on reward functions that run in a Ray actor (`RewardFunctionsActor`).

    Starting it imports the functions there and raises `RewardFunctionError` naming each target that
    cannot be loaded. `actor_options` go to the actor's `.options()` (default `num_cpus=0`, so that it
    never waits for a CPU the trainer's workers hold; add e.g. a `runtime_env`)."""

    def __init__(self, specs: Sequence[RewardFunctionSpec], *, actor_options: Mapping[str, Any] | None = None,
                 start_timeout_s: float = 60.0) -> None:
        self.specs = tuple(specs)
        seen: set[str] = set()
        for index, spec in enumerate(self.specs):
            if spec.name in seen:
                raise RewardFunctionError(f"rewards.functions[{index}].name {spec.name!r} is used twice; "
                                          "give each function its own name")
            seen.add(spec.name)
        self.restarts = 0  # actors replaced after a hang or a crash
        self._options = {"num_cpus": 0, **(actor_options or {})}
        self._start_timeout_s = start_timeout_s
        self._concurrent: frozenset[str] = frozenset()
        self._start_error: str | None = None
        self._actor: Any = self._start() if self.specs else None

    def score(self, prompts: Sequence[str], completions: Sequence[str],
              metas: Sequence[Mapping[str, Any]] | None = None) -> RewardScores:
        """Every function's score of every row, in the specs' order (None where it failed, with a
        `Failure` saying why). Raises only for columns of different lengths (`FlowError`)."""
        rows = _Rows(list(prompts), list(completions),
                     [dict(meta) for meta in metas] if metas is not None else [{} for _ in prompts])
        if not len(rows.prompts) == len(rows.completions) == len(rows.metas):
            raise FlowError(f"{len(rows.prompts)} prompts, {len(rows.completions)} completions and "
                            f"{len(rows.metas)} metas: pass one of each per row")
        self._start_error = None  # a replacement that failed to start is tried again once per batch
        values: dict[str, list[float | None]] = {}
        failures: list[Failure] = []
        for spec in self.specs:
            values[spec.name], reasons = self._score_function(spec, rows)
            failures += [Failure(row, spec.name, reason) for row, reason in enumerate(reasons)
                         if reason is not None]
        if failures:
            logger.warning("reward functions failed on %d rows (first: %s row %d %s)", len(failures),
                           failures[0].name, failures[0].row, failures[0].reason)
        return RewardScores(values, failures)

    def _score_function(self, spec: RewardFunctionSpec,
                        rows: _Rows) -> tuple[list[float | None], list[str | None]]:
        n = len(rows.prompts)
        scores: list[float | None] = [None] * n
        reasons: list[str | None] = [None] * n
        together = spec.batched or spec.name in self._concurrent
        calls = [list(range(n))] if together and n else [[row] for row in range(n)]
        retry = self._run(spec, calls, rows, scores, reasons)
        if retry:  # a batched call raised: find the rows it raises on
            self._run(spec, [[row] for row in retry], rows, scores, reasons)
        return scores, reasons

    def _run(self, spec: RewardFunctionSpec, calls: list[list[int]], rows: _Rows,
             scores: list[float | None], reasons: list[str | None]) -> list[int]:
        """Make `calls` (each a list of rows) one after the other, each given the spec's timeout; fill in
        `scores` and `reasons`. Returns the rows of the calls with several rows that raised. (One call at
        a time: with several queued, a crash in one can be reported for the one before it.)"""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayError

        actor = self._ensure_actor()
        if actor is None:
            for row in (row for call in calls for row in call):
                reasons[row] = self._start_error
            return []
        wait = spec.timeout_s + (_GRACE_S if spec.name in self._concurrent else 0.0)
        retry: list[int] = []
        for index, call in enumerate(calls):
            try:
                outcome: _Outcome = ray.get(actor.call.remote(spec.name, *rows.take(call)), timeout=wait)
            except (GetTimeoutError, RayActorError) as exc:
                what = (f"timed out after {spec.timeout_s:g} s" if isinstance(exc, GetTimeoutError)
                        else f"crashed the process it ran in ({type(exc).__name__})")
                self._replace(f"{spec.name} {what}")
                for row in call:
                    reasons[row] = what
                for row in (row for later in calls[index + 1:] for row in later):
                    reasons[row] = f"not called: {spec.name} {what} on row {call[0]} of this batch"
                return retry
            except RayError as exc:  # e.g. a meta the actor could not unpickle
                for row in call:
                    reasons[row] = f"could not be called: {type(exc).__name__}: {str(exc)[:300]}"
                continue
            if outcome.raised and len(call) > 1:
                retry += call
                continue
            for row, value, reason in zip(call, outcome.values, outcome.reasons, strict=True):
                scores[row], reasons[row] = value, reason
        return retry

    def _start(self) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayError

        actor: Any = ray.remote(RewardFunctionsActor).options(**self._options).remote(list(self.specs))
        try:
            loaded: _Loaded = ray.get(actor.load.remote(), timeout=self._start_timeout_s)
        except GetTimeoutError as exc:
            ray.kill(actor)
            raise FlowError(f"the reward functions' actor did not start within {self._start_timeout_s:g} s "
                            "(are their modules slow to import?); raise start_timeout_s") from exc
        except RayError as exc:
            ray.kill(actor)
            raise FlowError(f"the reward functions' actor failed to start: {str(exc)[:500]}") from exc
        if loaded.problems:
            ray.kill(actor)
            raise RewardFunctionError("\n".join(loaded.problems))
        self._concurrent = frozenset(loaded.concurrent)
        return actor

    def _ensure_actor(self) -> Any:
        """The running actor, or a new one; None when starting one failed in this batch."""
        if self._actor is None and self._start_error is None:
            try:
                self._actor = self._start()
            except OnlineRLError as exc:
                self._start_error = f"not called: the reward functions' actor could not be restarted: {exc}"
                logger.error("%s", self._start_error)
        return self._actor

    def _replace(self, why: str) -> None:
        import ray

        logger.warning("replacing the reward functions' actor: %s", why)
        with suppress(Exception):  # it may be gone already
            ray.kill(self._actor, no_restart=True)
        self._actor = None
        self.restarts += 1

    def close(self) -> None:
        """Stop the actor."""
        import ray

        if self._actor is not None:
            with suppress(Exception):
                ray.kill(self._actor, no_restart=True)
            self._actor = None

    def __enter__(self) -> RewardFunctions:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
