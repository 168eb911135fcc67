"""`online-rl demo`: simulated users on the running loop until versions are promoted and measured, then
the report.

Needs the loop up (`online-rl up`). The population talks to the gateway and the feedback API with the
run's user key; this process watches the rollout (admin key) and stops when `promotions` versions
have been promoted and the last has served `measure` answers with feedback since its promotion, or
when the time budget is spent. Then it gathers the gateway's decisions, MLflow's versions, the
samples each version was trained on (from the bus, through the version's lineage offsets) and a
general-ability check (fixed factual prompts, temperature 0, asked of the base model and the final
champion on the replica), and writes the report (`report.write_report`). It reads MLflow as the run's
read-only user, `inference`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from online_rl.config import Settings
from online_rl.demo.errors import DemoError
from online_rl.demo.report import ABILITY_PROMPTS, AbilityAnswer, build_report, correct, write_report
from online_rl.hardware import machine_info
from online_rl.launch import RunKeys, read_keys, read_registry_auth, read_state, status
from online_rl.registry.access import use_credentials
from online_rl.simulate import PROMPTS, Population, SimulationResult, load_preference, simulate

__all__ = ["DemoOptions", "run_demo"]


@dataclass(frozen=True)
class DemoOptions:
    """The simulated users, and when the demo stops: `promotions` versions promoted through the canary and
    the last one with `measure` answers with feedback since, or `budget_s` seconds of traffic spent.
    `show`: progress (bars on a terminal, else a line every `line_every_s` seconds)."""

    preference: str = "length:12"  # what the users like (see `online-rl simulate`)
    kind: str = "thumbs"  # their feedback: thumbs or rating
    users: int = 100
    silent: float = 0.1  # the share of users who never answer
    noise: float = 0.1  # the chance a thumb is flipped
    budget_s: float = 1200.0
    measure: int = 150
    concurrency: int = 8  # requests in flight
    max_tokens: int = 48
    temperature: float = 0.7
    seed: int = 0  # of the users' choices and noise
    promotions: int = 2
    show: bool = True
    line_every_s: float = 30.0
    settle_s: float = 60.0  # after the traffic: how long to wait for the gateway to act on the newest version

    def __post_init__(self) -> None:
        if self.kind not in ("thumbs", "rating"):
            raise DemoError(
                f"the demo measures reward per version from thumbs or ratings, not {self.kind!r} (in a "
                "pairwise choice both answers come from the same version: one wins, one loses)"
            )


@dataclass(frozen=True)
class _Records:
    """What the report is built from besides the users' answers, gathered after the run; `problems`: the
    parts that could not be gathered, and why."""

    history: list[dict[str, Any]]
    versions: list[dict[str, Any]]
    trained_on: dict[str, set[str]]
    ability: list[AbilityAnswer]
    precision: str | None
    problems: list[str]


def _wired(settings: Settings, wiring: dict[str, Any]) -> Settings:
    """The settings as the launched components see them (MLflow server, bus)."""
    mlflow = settings.mlflow.model_copy(update={"tracking_uri": wiring["mlflow_url"]})
    update: dict[str, Any] = {"mlflow": mlflow}
    if wiring.get("bootstrap"):
        update["kafka"] = settings.kafka.model_copy(update={"bootstrap_servers": wiring["bootstrap"]})
    else:
        update["bus"] = settings.bus.model_copy(
            update={"embedded_path": Path(wiring["run_dir"]) / "bus" / "bus.db"}
        )
    return settings.model_copy(update=update)


def _offsets(tag: str) -> dict[int, tuple[int, int]]:
    """'orl.samples/0:0-37;orl.samples/1:...' -> {partition: (first, end)}."""
    out = {}
    for part in filter(None, tag.split(";")):
        where, _, span = part.rpartition(":")
        first, _, end = span.partition("-")
        out[int(where.rsplit("/", 1)[1])] = (int(first), int(end))
    return out


def _trained_on(settings: Settings, versions: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Per version, the request ids behind the samples in its lineage offset ranges."""
    from online_rl.bus import open_bus
    from online_rl.errors import DecodeError
    from online_rl.events import TrainingSample, decode

    ranges = {v["version"]: _offsets(v["tags"].get("offsets", "")) for v in versions}
    out: dict[str, set[str]] = {v: set() for v in ranges}
    bus = open_bus(settings)
    try:
        for record in bus.read_all(settings.topics.samples):
            owners = [
                v
                for v, spans in ranges.items()
                if record.partition in spans
                and spans[record.partition][0] <= record.offset < spans[record.partition][1]
            ]
            if not owners or record.value is None:
                continue
            try:
                sample = decode(record.value, TrainingSample)
            except DecodeError:
                continue
            ids = {c.request_id for c in (sample.completion, sample.chosen, sample.rejected) if c is not None}
            for v in owners:
                out[v] |= ids
    finally:
        bus.close()
    return out


def _ability(inference_url: str, key: str, models: list[str]) -> list[AbilityAnswer]:
    out = []
    with httpx.Client(
        base_url=inference_url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    ) as http:
        for model in models:
            for prompt, accepted in ABILITY_PROMPTS:
                response = http.post(
                    "/v1/chat/completions",
                    json={
                        "model": model,
                        "temperature": 0,
                        "max_tokens": 48,
                        "messages": [{"role": "user", "content": prompt}],
                    },
                )
                response.raise_for_status()
                text = response.json()["choices"][0]["message"]["content"] or ""
                out.append(AbilityAnswer(model, prompt, text, correct(text, accepted)))
    return out


def _mlflow_versions(settings: Settings) -> list[dict[str, Any]]:
    from online_rl.tracking import mlflow_client

    client = mlflow_client(settings)
    found = client.search_model_versions(f"name='{settings.mlflow.registered_model}'")
    return sorted(
        (
            {
                "version": str(v.version),
                "aliases": sorted(v.aliases or []),
                "tags": dict(v.tags or {}),
                "created_at": v.creation_timestamp / 1000,
            }
            for v in found
        ),
        key=lambda v: int(v["version"]),
    )


def _recent(result: SimulationResult) -> str:
    rewards = [a.reward for a in result.answers[-200:] if a.reward is not None]
    return f"{sum(rewards) / len(rewards):.2f}" if rewards else "—"


def _arm(now: dict[str, Any]) -> str:
    rollout = now.get("rollout") or {}
    if not rollout:
        return "no rollout yet"
    challenger = (now.get("arms") or {}).get("challenger") or {}
    running = rollout.get("status") == "running"
    rewards = f" ({challenger.get('rewards', 0)} rewards this step)" if running else ""
    return f"v{rollout.get('challenger')} {rollout.get('status')} at {rollout.get('weight', 0):.0%}{rewards}"


def _trainer(wiring: dict[str, Any]) -> str:
    """The trainer's step and last published version, from its Prometheus metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(wiring["trainer_metrics_url"] + "/metrics", timeout=2).text
    except httpx.HTTPError:
        return "trainer not answering"
    values = {sample.name: sample.value for family in text_string_to_metric_families(text)
              for sample in family.samples}
    published = int(values.get("orl_trainer_last_published_version", 0))
    return (f"trainer step {int(values.get('orl_trainer_steps_total', 0))}, "
            + (f"last published v{published}" if published else "nothing published yet"))


def _trainer_precision(settings: Settings) -> str | None:
    """What the trainer's `precision` resolved to (its latest MLflow run's params)."""
    from online_rl.tracking import mlflow_client

    client = mlflow_client(settings)
    experiment = client.get_experiment_by_name(settings.trainer.experiment)
    if experiment is None:
        return None
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"],
                              max_results=1)
    return runs[0].data.params.get("precision_resolved") if runs else None


def _components(settings: Settings, since: float) -> dict[str, dict[str, Any]]:
    """Each component's restarts, and for those that exited during the run, when and the end of their log
    (recorded by `up`'s watchdog)."""
    state = read_state(settings.run_dir.resolve()) or {"components": {}}
    out = {}
    for name, entry in state["components"].items():
        exits = [t for t in entry.get("restart_times", []) if t >= since]
        last = entry.get("last_exit") or {}
        failed = bool(entry.get("gave_up")) and entry["gave_up"]["at"] >= since
        out[name] = {"restarts": int(entry.get("restarts", 0)),
                     "exited_during_run": bool(exits) or failed or last.get("at", 0) >= since,
                     "failed": failed, "tail": last.get("tail", ""), "exit_code": last.get("code")}
    return out


def _ready(settings: Settings) -> tuple[dict[str, Any], RunKeys]:
    """The running loop's wiring and keys; DemoError unless it is up and every component is ready."""
    wiring, components = status(settings)
    if wiring is None:
        raise DemoError(f"the loop is not up (no run in {settings.run_dir}); start it with `online-rl up`")
    down = [c.name for c in components if c.state != "ready"]
    if down:
        raise DemoError(
            f"not every component is ready ({', '.join(down)}); see `online-rl status` and the logs "
            f"in {settings.run_dir / 'logs'}"
        )
    return wiring, read_keys(settings.run_dir)


def _admin(wiring: dict[str, Any], keys: RunKeys) -> httpx.Client:
    """A client of the gateway with the admin key."""
    return httpx.Client(
        base_url=wiring["gateway_url"], headers={"Authorization": f"Bearer {keys.admin}"}, timeout=10
    )


def _history(admin: httpx.Client, started: float) -> list[dict[str, Any]]:
    """The gateway's rollout decisions since `started` (this demo's only)."""
    entries = admin.get("/rollout/history", params={"limit": 10_000}).json()["entries"]
    return [e for e in entries if e["at"] >= started]


def _measured(promoted: list[dict[str, Any]], result: SimulationResult, registered: str) -> int:
    """Answers with feedback the last promoted version served since its promotion (0 before one)."""
    if not promoted:
        return 0
    last = promoted[-1]
    name = f"{registered}-v{last['version']}"
    return sum(
        1 for a in list(result.answers) if a.version == name and a.at >= last["at"] and a.reward is not None
    )


def _progress(disabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f}"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}"),
        disable=disabled,
        refresh_per_second=2,
    )


def _watch(
    admin: httpx.Client,
    users: threading.Thread,
    result: SimulationResult,
    wiring: dict[str, Any],
    registered: str,
    options: DemoOptions,
    started: float,
    echo: Callable[[str], None],
) -> str:
    """Follow the rollout while the users talk: "goal" once the promotions and the measured answers are
    in, "budget" when the time budget is spent (or the users stopped)."""
    # On a terminal: progress bars. Without one (CI, nohup, a pipe) the bars print nothing, so a plain
    # line at least every `line_every_s` shows the run is alive.
    bars_on = options.show and sys.stdout.isatty()
    last_line = 0.0
    with _progress(disabled=not bars_on) as bars:
        budget = bars.add_task("time budget (s)     ", total=options.budget_s, note="")
        after = bars.add_task("after the promotions", total=options.measure, note="waiting for a promotion")
        while time.time() - started < options.budget_s and users.is_alive():
            time.sleep(2.0)
            try:
                history = _history(admin, started)
                now = admin.get("/rollout").json()
            except (httpx.HTTPError, ValueError, KeyError):
                continue
            promoted = [e for e in history if e["action"] == "promote"]
            measured = _measured(promoted, result, registered)
            if promoted:
                bars.update(
                    after,
                    completed=min(measured, options.measure) if len(promoted) >= options.promotions else 0,
                    note=f"{registered}-v{promoted[-1]['version']} promoted ({len(promoted)} of "
                    f"{options.promotions})",
                )
            note = f"{result.requests} answers · reward (last 200) {_recent(result)} · {_arm(now)}"
            bars.update(budget, completed=time.time() - started, note=note)
            if options.show and not bars_on and time.time() - last_line >= options.line_every_s:
                last_line = time.time()
                echo(f"[{(last_line - started) / 60:4.1f} min] {note} · {_trainer(wiring)} · promoted "
                     f"{len(promoted)}/{options.promotions}"
                     + (f", {measured}/{options.measure} measured" if promoted else ""))
            if len(promoted) >= options.promotions and measured >= options.measure:
                return "goal"
    return "budget"


def _run_users(
    wiring: dict[str, Any],
    keys: RunKeys,
    population: Population,
    registered: str,
    options: DemoOptions,
    started: float,
    echo: Callable[[str], None],
) -> tuple[SimulationResult, str]:
    """The simulated users on the loop until the goal or the budget: what they got, and what stopped them."""
    result, stop, failure = SimulationResult(), threading.Event(), []

    def users_talk() -> None:
        try:
            simulate(wiring["gateway_url"], wiring["feedback_url"], keys.user, population, None, PROMPTS,
                     options.concurrency, options.max_tokens, options.temperature, stop=stop.is_set,
                     result=result)
        except BaseException as exc:  # surfaced below, not lost in a thread
            failure.append(exc)

    users = threading.Thread(target=users_talk, daemon=True)
    users.start()
    admin = _admin(wiring, keys)
    try:
        stopped_by = _watch(admin, users, result, wiring, registered, options, started, echo)
    finally:
        stop.set()
        users.join(timeout=600)
        admin.close()
    if failure:
        raise DemoError(f"the simulated users stopped: {failure[0]!r}") from failure[0]
    return result, stopped_by


def settled(challenger: str | None, now: dict[str, Any], history: list[dict[str, Any]]) -> bool:
    """Whether the gateway has acted on `challenger` (the version MLflow's alias names), given its
    rollout status `now` and its decisions `history`: no challenger, a decision on it, it is the
    champion already, or a rollout of another version is running (it waits its turn)."""
    if challenger is None or challenger in {str(e["version"]) for e in history}:
        return True
    if str((now.get("champion") or {}).get("version")) == challenger:
        return True
    rollout = now.get("rollout") or {}
    return rollout.get("status") == "running" and str(rollout.get("challenger")) != challenger


def _settle(settings: Settings, wiring: dict[str, Any], keys: RunKeys, started: float, settle_s: float,
            echo: Callable[[str], None]) -> str | None:
    """Wait (at most `settle_s`) until the gateway has acted on the version MLflow's `challenger` alias
    names, so a version the trainer published as the traffic ended is in the report with its decision,
    not listed in MLflow alone. Settled too: no challenger, or a rollout of another version running (the
    newest waits its turn there as it would with users). None when settled, else what was left."""
    deadline, said = time.monotonic() + settle_s, False
    with _admin(wiring, keys) as admin:
        while True:
            newest = [v["version"] for v in _mlflow_versions(settings) if "challenger" in v["aliases"]]
            now = admin.get("/rollout").json()
            if settled(newest[0] if newest else None, now, _history(admin, started)):
                return None
            if time.monotonic() >= deadline:
                last = now.get("last_error")
                why = f" (its last error: {last})" if last else ""
                return (f"version {newest[0]} was published but the gateway had not acted on it "
                        f"{settle_s:.0f} s after the traffic ended{why}")
            if not said:
                echo(f"waiting up to {settle_s:.0f} s for the gateway to act on version {newest[0]} ...")
                said = True
            time.sleep(1.0)


def _gather(
    settings: Settings, wiring: dict[str, Any], keys: RunKeys, started: float, echo: Callable[[str], None],
    settle_s: float = 0.0,
) -> _Records:
    """The rollout decisions, MLflow's versions, each version's training lineage, the general-ability
    check and the trainer's precision; a part that fails is left empty and named in `problems`."""
    problems: list[str] = []
    registry = read_registry_auth(settings.run_dir.resolve())
    reader = registry.users.get("inference") if registry else None  # MLflow is read as the serving user
    wired = _wired(settings, wiring)

    def gather(what: str, call: Callable[[], Any], empty: Any) -> Any:
        try:
            with use_credentials(reader):
                return call()
        except Exception as exc:  # one missing section must not lose the rest of the report
            problems.append(f"{what}: {exc!r}")
            echo(f"  could not gather {what}: {exc!r}")
            return empty

    def final_history() -> list[dict[str, Any]]:
        with _admin(wiring, keys) as http:
            return _history(http, started)

    unsettled = gather("the newest version's rollout",
                       lambda: _settle(wired, wiring, keys, started, settle_s, echo), None)
    if unsettled:
        problems.append(unsettled)
    history = gather("rollout decisions", final_history, [])
    versions = gather("MLflow versions", lambda: _mlflow_versions(wired), [])
    trained_on = gather("training lineage", lambda: _trained_on(wired, versions), {})
    registered, base_model = settings.mlflow.registered_model, settings.model.name
    champion = [f"{registered}-v{e['version']}" for e in history if e["action"] == "promote"][-1:]
    ability = gather(
        "general ability", lambda: _ability(wiring["inference_url"], keys.admin, [base_model, *champion]), []
    )
    precision = gather("trainer precision", lambda: _trainer_precision(wired), None)
    return _Records(history, versions, trained_on, ability, precision, problems)


def _meta(
    settings: Settings,
    wiring: dict[str, Any],
    options: DemoOptions,
    population: Population,
    result: SimulationResult,
    started: float,
    ended: float,
    stopped_by: str,
    records: _Records,
) -> dict[str, Any]:
    """The run's particulars for the report: the users, the traffic, the goal, where to look, the machine
    and how the components fared."""
    return {
        "preference": population.preference.name,
        "kind": options.kind,
        "users": options.users,
        "silent": options.silent,
        "noise": options.noise,
        "requests": result.requests,
        "failed": result.failed,
        "feedback_failed": result.feedback_failed,
        "started_at": started,
        "duration_s": round(ended - started, 1),
        "budget_s": options.budget_s,
        "measure": options.measure,
        "promotions_wanted": options.promotions,
        "registered": settings.mlflow.registered_model,
        "base_model": settings.model.name,
        "mlflow_url": wiring["mlflow_url"],
        "gateway_url": wiring["gateway_url"],
        "keys_file": str(settings.run_dir / "keys.json"),
        "problems": records.problems,
        "stopped_by": stopped_by,
        "machine": machine_info(records.precision),
        "components": _components(settings, started),
    }


def run_demo(
    settings: Settings,
    out_dir: Path,
    options: DemoOptions = DemoOptions(),
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the simulated users on the running loop until `options.promotions` versions have been promoted
    through the canary and the last one has `options.measure` answers with feedback since (or
    `options.budget_s` is spent), then write and return the report."""
    wiring, keys = _ready(settings)
    population = Population(
        load_preference(options.preference), options.users, options.silent, options.noise,
        options.kind, options.seed,  # type: ignore[arg-type]
    )
    registered, base_model = settings.mlflow.registered_model, settings.model.name
    started = time.time()
    result, stopped_by = _run_users(wiring, keys, population, registered, options, started, echo)
    ended = time.time()
    answers = list(result.answers)
    echo("gathering the report: rollout decisions, MLflow versions, training lineage, general ability ...")
    records = _gather(settings, wiring, keys, started, echo, options.settle_s)
    meta = _meta(settings, wiring, options, population, result, started, ended, stopped_by, records)
    report = build_report(answers, records.history, records.versions, records.trained_on, records.ability,
                          base_model, registered, meta)
    write_report(report, out_dir)
    return report
