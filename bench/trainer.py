"""Trainer benchmark: samples/s and freshness of the long-running trainer with 1 and 2 Ray workers.

    deploy/local/env.sh .venv/bin/python bench/trainer.py [--backlog 64] [--stream 48] [--rate 2]
        [--rounds 3] [--smoke]

On a real Kafka broker (started for the run unless `--bootstrap`), a real MLflow store and a local
Ray runtime, with the embedded model (SmolLM2-135M-Instruct; `--smoke`: a random 1-layer Llama of
hidden size 64 with its tokenizer), LoRA r=8 on q,k,v,o and batches of 8 preference pairs,
for each precision (`--precision auto`, the default: float32, and bfloat16 too where `precision: auto`
picks it on this machine; `--smoke`: float32 only, as bfloat16 on a 64-wide model says nothing), it
runs the whole trainer (`online_rl.trainer.Trainer`: collect, score, update, publish, checkpoint,
commit) once per worker count and round, the worker counts alternated over `--rounds` (1 2, 2 1, ...),
each run in two phases:

1. **Throughput**: `--backlog` pairs already on the bus; samples/s = pairs trained / time from the
   first step's start to the end of the checkpoint of the step that finished the backlog (so the
   publishes and checkpoints on the way, the last ones included, are inside the time).
2. **Freshness**: `--stream` more pairs produced at `--rate` per second while the trainer runs,
   publishing every `--publish-every` samples, until every pair is trained (or, once the last one is
   produced, the trainer has been idle for `--idle-exit` seconds). A sample's freshness is the
   registration time of the first MLflow version whose lineage covers its offset minus the sample's
   timestamp on the bus (it includes waiting for the publish threshold: at 2/s and 16 per version
   that alone is about 4 s on average). Every streamed sample counts: one that no version covers
   when the run ends (the last samples short of the threshold, or any never trained) is *censored*:
   it counts as the run's end (when `Trainer.run` returned) minus its timestamp, which its real
   freshness can only exceed, and `unpublished` says how many there were. So when `unpublished` is
   above 0 the median and p90 are lower bounds. (Ending the run with an extra publish instead would
   hand the tail a version the live trainer would not have published yet, flattering the figure.)

Each figure is the `spread` (median, min, max over the rounds) of the per-run figures (freshness: the
run's median and p90); `scaling_2_vs_1` is the spread of the per-round ratios of samples/s with 2
workers over 1. Ray is told the machine's real cores (`os.cpu_count()`), and the workers share them
equally (1 worker x 2 threads vs 2 workers x 1 thread on 2 cores; fractions of a CPU when the workers
outnumber the cores). The last line is one JSON object: `samples_per_s`, `freshness_s`,
`freshness_p90_s` and `unpublished` (1 worker), the same with `_2` (2 workers) and `scaling_2_vs_1`,
for the last precision run (`precision`: bf16 where `auto` runs it, else fp32); the same figures of
every precision run with a `_fp32`/`_bf16` suffix; the sizes; the machine (CPU model, ISA, cores).
With the default `--workers 1,2` it holds every name of `FIELDS`.
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import alternated, emit, kafka_broker, missing_fields, precisions, spread
from online_rl.bus.kafka import KafkaBus
from online_rl.config import Settings, load_settings
from online_rl.events import Completion, FeedbackKind, Message, TrainingSample, encode

PREFERRED, AVOIDED = 1000, 2000
FIGURES = ("samples_per_s", "freshness_s", "freshness_p90_s", "unpublished")
FIELDS: tuple[str, ...] = (  # a literal: tests/bench reads it from the source
    "smoke", "precision", "rounds", "workers", "cores", "backlog", "stream", "rate_per_s",
    "publish_every_samples", "samples_per_s", "freshness_s", "freshness_p90_s", "unpublished",
    "samples_per_s_2", "freshness_s_2", "freshness_p90_s_2", "unpublished_2", "scaling_2_vs_1", "machine",
)
SMOKE = {"backlog": 16, "stream": 12, "rate": 4.0, "publish_every": 8, "idle_exit": 3.0, "rounds": 1}
_CONTROLLER = "online_rl.trainer.controller"
STALLED_S = 300.0  # a trainer that trains nothing for this long ends its run (the benchmark then fails)
Windows = list[tuple[float, dict[str, list[int]]]]  # per version: registered at, {partition: [first, end)}
Results = dict[tuple[str, int], list[dict[str, float]]]  # per (precision, workers): each round's figures


class _Events(logging.Handler):
    """Collects the trainer's structured events: (time, event, samples in the step)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[tuple[float, str, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", None)
        if event in ("step_started", "step", "checkpoint"):
            self.events.append((record.created, event, int(getattr(record, "batch", 0))))

    def trained(self) -> int:
        return sum(batch for _, event, batch in self.events if event == "step")

    def quiet_for(self) -> float:
        """Seconds since the trainer last did anything (0 while a step runs)."""
        if not self.events or self.events[-1][1] == "step_started":
            return 0.0
        return time.time() - self.events[-1][0]


def _pair(i: int, rng: random.Random, model: str) -> TrainingSample:
    def ids(low: int, high: int) -> list[int]:
        return [rng.randrange(100, 40000) for _ in range(rng.randint(low, high))]

    prompt, stem = ids(32, 64), ids(16, 40)
    return TrainingSample(
        sample_id=f"b{i}-{uuid.uuid4().hex[:6]}", kind="pair", model=model, user_id=f"u{i % 50}",
        prompt=[Message(role="user", content=f"q{i}")], prompt_token_ids=prompt,
        chosen=Completion(request_id=f"c{i}", text="-", token_ids=[*stem, PREFERRED], logprobs=[]),
        rejected=Completion(request_id=f"r{i}", text="-", token_ids=[*stem, AVOIDED], logprobs=[]),
        feedback_kind=FeedbackKind.preference, reward_mapping_version="bench",
        behaviour_versions=[None, None], created_at=time.time(),
    )


def cpus_per_worker(workers: int) -> tuple[int, float]:
    """The machine's cores (all Ray is told about) and each worker's equal share of them (rounded down
    to 1/1000, so that Ray can place every worker)."""
    cores = os.cpu_count() or 1
    return cores, math.floor(cores / workers * 1000) / 1000


def _settings(base: Settings, bootstrap: str, workers: int, args: argparse.Namespace, root: Path,
              precision: str) -> Settings:
    cores, cpus = cpus_per_worker(workers)
    return base.model_copy(update={
        "cache_dir": root, "model": base.model.model_copy(update={"path": args.model_dir}),
        "ray": base.ray.model_copy(update={"num_cpus": cores}),
        "kafka": base.kafka.model_copy(update={"bootstrap_servers": bootstrap}),
        "bus": base.bus.model_copy(update={"topic_prefix": f"bt{uuid.uuid4().hex[:8]}"}),
        "mlflow": base.mlflow.model_copy(update={"registered_model": "bench-policy", "tracking_uri": None}),
        "trainer": base.trainer.model_copy(update={
            "workers": workers, "cpus_per_worker": cpus, "precision": precision,
            "batch_size": 8, "batch_timeout_s": 0.5, "learning_rate": 1e-4,
            "publish_every_samples": args.publish_every, "publish_every_s": 3600.0,
            "checkpoint_dir": root / "checkpoints", "group_id": f"bench-{uuid.uuid4().hex[:6]}"}),
    })


def measure(base: Settings, bootstrap: str, workers: int, args: argparse.Namespace,
            precision: str) -> dict[str, float]:
    """One trainer run: the backlog, then the stream; its samples/s and its streamed samples' freshness."""
    from online_rl.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="orl-bench-trainer-") as tmp:
        settings = _settings(base, bootstrap, workers, args, Path(tmp), precision)
        topics = settings.topics
        bus = KafkaBus(bootstrap)
        bus.create_topic(topics.samples, 2)
        bus.create_topic(topics.dlq, 1)
        producer = bus.producer()
        rng = random.Random(workers)
        for i in range(args.backlog):
            producer.produce(topics.samples, encode(_pair(i, rng, settings.model.name)), str(i).encode())
        producer.flush()

        events = _Events()
        controller = logging.getLogger(_CONTROLLER)
        controller.addHandler(events)
        controller.setLevel(logging.DEBUG)  # the checkpoint events are debug records
        trainer = Trainer(settings, bus)

        done = threading.Event()

        def stream() -> None:  # phase 2 begins once the backlog is trained
            while events.trained() < args.backlog:
                time.sleep(0.1)
            for i in range(args.stream):
                sample = _pair(args.backlog + i, rng, settings.model.name)
                producer.produce(topics.samples, encode(sample), f"stream-{i}".encode())
                producer.flush()
                time.sleep(1.0 / args.rate)
            while events.trained() < args.backlog + args.stream and events.quiet_for() <= args.idle_exit:
                time.sleep(0.1)
            done.set()

        feeder = threading.Thread(target=stream, daemon=True)
        feeder.start()
        try:
            trainer.run(stop=done, idle_exit_s=STALLED_S)
        finally:
            controller.removeHandler(events)
        run_end = time.time()
        producer.close()
        windows = _versions(settings, trainer, topics.samples, Path(tmp))
        freshness, unpublished = _freshness(bus, topics.samples, windows, run_end)
        bus.close()
    return {"samples_per_s": _throughput(events.events, args.backlog),
            "freshness_s": statistics.median(freshness),
            "freshness_p90_s": freshness[int(0.9 * (len(freshness) - 1))],
            "unpublished": float(unpublished), "versions": float(len(windows))}


def _throughput(events: list[tuple[float, str, int]], backlog: int) -> float:
    """Backlog pairs / time from the first step's start to the end of the checkpoint that followed the
    step finishing the backlog (that step's publish and checkpoint included)."""
    started = next((t for t, e, _ in events if e == "step_started"), 0.0)
    done, end = 0, None
    for t, event, batch in events:
        if event == "step" and done < backlog:
            done += batch
        elif event == "checkpoint" and done >= backlog:
            end = t
            break
    if end is None:
        raise SystemExit(f"the trainer trained nothing for {STALLED_S:.0f} s and stopped after {done} of the "
                         f"{backlog} backlog pairs: see its log above")
    return done / (end - started)


def _versions(settings: Settings, trainer: Any, topic: str, tmp: Path) -> Windows:
    """Each published version's registration time and the offsets of `topic` its lineage covers."""
    import mlflow

    from online_rl.registry import read_lineage
    from online_rl.tracking import mlflow_client

    client = mlflow_client(settings)
    name = settings.mlflow.registered_model
    windows = []
    for published in trainer.published:
        version = client.get_model_version(name, published.version)
        folder = mlflow.artifacts.download_artifacts(f"models:/{name}/{published.version}",
                                                     dst_path=str(tmp / f"v{published.version}"))
        windows.append((version.creation_timestamp / 1000, read_lineage(Path(folder)).offsets.get(topic, {})))
    return windows


def _freshness(bus: KafkaBus, topic: str, windows: Windows, run_end: float) -> tuple[list[float], int]:
    """Every streamed sample's freshness, sorted (an unpublished one censored at `run_end`), and how many
    were unpublished."""
    freshness, unpublished = [], 0
    for record in bus.read_all(topic):
        if not (record.key or b"").startswith(b"stream-"):
            continue
        registered = _registered_at(windows, record.partition, record.offset)
        if registered is None:
            unpublished += 1
            registered = run_end
        freshness.append(registered - record.timestamp)
    if not freshness:
        raise SystemExit("no streamed sample reached the bus: raise --stream")
    return sorted(freshness), unpublished


def _registered_at(windows: Windows, partition: int, offset: int) -> float | None:
    """When the first version whose lineage covers (partition, offset) was registered."""
    for registered, offsets in windows:
        first, end = offsets.get(str(partition), [0, 0])
        if first <= offset < end:
            return registered
    return None


def run_all(args: argparse.Namespace, chosen: list[str], workers: list[int]) -> Results:
    """Per (precision, worker count), the figures of each round, the counts alternated per round."""
    import ray

    base = load_settings()
    results: Results = {(p, w): [] for p in chosen for w in workers}
    with kafka_broker(args.bootstrap) as bootstrap:
        for precision in chosen:
            for round_, order in enumerate(alternated(args.rounds, [str(w) for w in workers])):
                for count in map(int, order):
                    figures = measure(base, bootstrap, count, args, precision)
                    gc.collect()  # the run's Kafka clients go before the broker does
                    results[precision, count].append(figures)
                    print(f"{precision}, round {round_ + 1}, {count} worker(s): "
                          f"{figures['samples_per_s']:.2f} samples/s, freshness median "
                          f"{figures['freshness_s']:.1f} s, p90 {figures['freshness_p90_s']:.1f} s "
                          f"({figures['versions']:.0f} versions, {figures['unpublished']:.0f} of "
                          f"{args.stream} streamed samples unpublished at the end)", flush=True)
        ray.shutdown()  # nothing of Ray's is printed after the result line
    return results


def summary(results: Results, main_precision: str) -> dict[str, Any]:
    """The JSON figures: spreads per (precision, worker count), and the 2-over-1 scaling."""
    out: dict[str, Any] = {}
    for (precision, workers), runs in results.items():
        for tail in ([""] if precision == main_precision else []) + [f"_{precision}"]:
            suffix = ("" if workers == 1 else f"_{workers}") + tail
            out |= {f"{name}{suffix}": spread([r[name] for r in runs], 3) for name in FIGURES}
        if workers == 2 and (precision, 1) in results:
            ratios = [two["samples_per_s"] / one["samples_per_s"]
                      for one, two in zip(results[precision, 1], runs, strict=True)]
            scaling = spread(ratios)
            out[f"scaling_2_vs_1_{precision}"] = scaling
            if precision == main_precision:
                out["scaling_2_vs_1"] = scaling
            print(f"{precision}: 2 workers / 1 worker: x{scaling['median']:.2f} samples/s "
                  f"[{scaling['min']:.2f}, {scaling['max']:.2f}] over {scaling['rounds']} round(s)")
    return out


def _smoke_model(folder: Path) -> Path:
    from online_rl.models import build_tiny_llama, prepare_embedded_model

    tokenizer = prepare_embedded_model(load_settings().model_dir).path
    return build_tiny_llama(folder / "model", tokenizer, seed=0, hidden_size=64, num_layers=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog", type=int, default=64, help="pairs on the bus before the trainer starts")
    parser.add_argument("--stream", type=int, default=48, help="pairs produced while it runs")
    parser.add_argument("--rate", type=float, default=2.0, help="streamed pairs per second")
    parser.add_argument("--publish-every", type=int, default=16, help="samples per published version")
    parser.add_argument("--idle-exit", type=float, default=6.0,
                        help="after the stream, stop once the trainer has been idle this long")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the worker counts alternated")
    parser.add_argument("--bootstrap", default=None, help="an existing Kafka broker (else one is started)")
    parser.add_argument("--precision", default=None,
                        help="auto (fp32, and bf16 where auto picks it here; the default) or "
                        "comma-separated: bf16, fp32 (the default with --smoke: fp32)")
    parser.add_argument("--smoke", action="store_true",
                        help=f"a tiny model and sizes ({SMOKE}), the precision auto picks: checks that "
                        "every field is printed")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    logging.basicConfig(level=logging.WARNING)
    for handler in logging.getLogger().handlers:  # the trainer's progress, not its debug records
        handler.setLevel(logging.INFO)
    workers = [int(w) for w in args.workers.split(",")]
    chosen = precisions(args.precision or ("fp32" if args.smoke else "auto"))
    main_precision = chosen[-1]  # with auto, bf16 where auto picks it here, else fp32
    with tempfile.TemporaryDirectory(prefix="orl-bench-trainer-model-") as tmp:
        args.model_dir = _smoke_model(Path(tmp)) if args.smoke else load_settings().model_dir
        results = run_all(args, chosen, workers)
    out = {"smoke": args.smoke, "precision": main_precision, "rounds": args.rounds, "workers": workers,
           "cores": os.cpu_count() or 1, "backlog": args.backlog, "stream": args.stream,
           "rate_per_s": args.rate, "publish_every_samples": args.publish_every,
           **summary(results, main_precision)}
    missing = missing_fields(out | {"machine": None}, FIELDS)
    if missing and {1, 2} <= set(workers):
        raise SystemExit(f"the result lacks the documented fields {missing}")
    emit(out, main_precision)


if __name__ == "__main__":
    main()
