"""Trainer benchmark: samples/s and freshness of the long-running trainer with 1 and 2 Ray workers.

    deploy/local/env.sh .venv/bin/python bench/trainer.py [--backlog 64] [--stream 48] [--rate 2]

On a real Kafka broker (started for the run unless `--bootstrap`), a real MLflow store and a local Ray
runtime, with the embedded model (SmolLM2-135M-Instruct, LoRA r=8 on q,k,v,o, batches of 8 preference
pairs), for each precision (`--precision auto`: float32, and bfloat16 too where `precision: auto` picks
it on this machine) and each worker count, it runs the whole trainer (`online_rl.trainer.Trainer`: collect,
score, update, checkpoint, commit, publish) in two phases:

1. **Throughput**: `--backlog` pairs already on the bus; samples/s = pairs trained / time from the
   first step's start to the last backlog step's end (checkpoints and commits included).
2. **Freshness**: `--stream` more pairs produced at `--rate` per second while the trainer runs,
   publishing every `--publish-every` samples. A sample's freshness is the registration time of the
   first MLflow version whose lineage covers its offset minus the sample's timestamp on the bus.
   The median and p90 over the streamed samples are reported (it includes waiting for the publish
   threshold: at 2/s and 16 per version that alone is about 4 s on average).

The 1-worker run is the baseline; `scaling_2_vs_1` is samples/s with 2 workers over 1 (on the 2 cores
here both runs have the same CPUs: 1 worker x 2 threads vs 2 workers x 1 thread). The last line is one
JSON object: `samples_per_s` and `freshness_s` (1 worker), `samples_per_s_2` and `freshness_s_2`
(2 workers), p90s and `scaling_2_vs_1`, for the precision `auto` picks here (`precision`), the same
figures of every precision run with a `_fp32`/`_bf16` suffix, and the machine (CPU model, ISA, cores).
"""

from __future__ import annotations

import argparse
import logging
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

from bench.common import emit, kafka_broker, precisions
from online_rl.bus.kafka import KafkaBus
from online_rl.bus.topics import Topics
from online_rl.config import Settings, load_settings
from online_rl.events import Completion, FeedbackKind, Message, TrainingSample, encode

PREFERRED, AVOIDED = 1000, 2000


class _Steps(logging.Handler):
    """Collects the trainer's structured step events (time, event, step, batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[float, str, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", None)
        if event in ("step_started", "step"):
            self.events.append((record.created, event, int(getattr(record, "batch", 0))))


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


def _settings(base: Settings, bootstrap: str, workers: int, publish_every: int, root: Path,
              precision: str) -> Settings:
    cpus = base.ray.num_cpus
    return base.model_copy(update={
        "cache_dir": root, "model": base.model.model_copy(update={"path": base.model_dir}),
        "kafka": base.kafka.model_copy(update={"bootstrap_servers": bootstrap}),
        "bus": base.bus.model_copy(update={"topic_prefix": f"bt{uuid.uuid4().hex[:8]}"}),
        "mlflow": base.mlflow.model_copy(update={"registered_model": "bench-policy", "tracking_uri": None}),
        "trainer": base.trainer.model_copy(update={
            "workers": workers, "cpus_per_worker": max(1.0, cpus / workers), "precision": precision,
            "batch_size": 8, "batch_timeout_s": 0.5, "learning_rate": 1e-4,
            "publish_every_samples": publish_every, "publish_every_s": 3600.0,
            "checkpoint_dir": root / "checkpoints", "group_id": f"bench-{uuid.uuid4().hex[:6]}"}),
    })


def measure(base: Settings, bootstrap: str, workers: int, args: argparse.Namespace,
            precision: str) -> dict[str, float]:
    import mlflow

    from online_rl.registry import read_lineage
    from online_rl.tracking import mlflow_client
    from online_rl.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="orl-bench-trainer-") as tmp:
        settings = _settings(base, bootstrap, workers, args.publish_every, Path(tmp), precision)
        topics = Topics(settings.bus.topic_prefix)
        bus = KafkaBus(bootstrap)
        bus.create_topic(topics.samples, 2)
        bus.create_topic(topics.dlq, 1)
        producer = bus.producer()
        rng = random.Random(workers)
        for i in range(args.backlog):
            producer.produce(topics.samples, encode(_pair(i, rng, settings.model.name)), str(i).encode())
        producer.flush()

        steps = _Steps()
        logging.getLogger("online_rl.trainer.controller").addHandler(steps)
        logging.getLogger("online_rl.trainer.controller").setLevel(logging.INFO)
        trainer = Trainer(settings, bus)

        def stream() -> None:  # phase 2 begins once the backlog is trained
            while sum(b for _, e, b in steps.events if e == "step") < args.backlog:
                time.sleep(0.1)
            for i in range(args.stream):
                sample = _pair(args.backlog + i, rng, settings.model.name)
                producer.produce(topics.samples, encode(sample), f"stream-{i}".encode())
                producer.flush()
                time.sleep(1.0 / args.rate)

        feeder = threading.Thread(target=stream, daemon=True)
        feeder.start()
        try:
            trainer.run(idle_exit_s=args.idle_exit)
        finally:
            logging.getLogger("online_rl.trainer.controller").removeHandler(steps)

        # phase 1: samples/s over the steps that trained the backlog
        started = next(t for t, e, _ in steps.events if e == "step_started")
        done, end = 0, started
        for t, event, batch in steps.events:
            if event == "step" and done < args.backlog:
                done, end = done + batch, t
        samples_per_s = done / (end - started)

        # phase 2: freshness of every streamed sample
        client = mlflow_client(settings)
        windows: list[tuple[float, dict[str, list[int]]]] = []
        for published in trainer.published:
            version = client.get_model_version(settings.mlflow.registered_model, published.version)
            folder = mlflow.artifacts.download_artifacts(
                f"models:/{settings.mlflow.registered_model}/{published.version}",
                dst_path=str(Path(tmp) / f"v{published.version}"))
            lineage = read_lineage(Path(folder))
            windows.append((version.creation_timestamp / 1000, lineage.offsets.get(topics.samples, {})))
        freshness = []
        for record in bus.read_all(topics.samples):
            if not (record.key or b"").startswith(b"stream-"):
                continue
            registered = _registered_at(windows, record.partition, record.offset)
            if registered is not None:  # else trained but not yet published when the run ended
                freshness.append(registered - record.timestamp)
        bus.close()
        freshness.sort()
        return {"samples_per_s": samples_per_s, "freshness_s": statistics.median(freshness),
                "freshness_p90_s": freshness[int(0.9 * (len(freshness) - 1))], "versions": len(windows),
                "fresh_samples": len(freshness)}


def _registered_at(windows: list[tuple[float, dict[str, list[int]]]], partition: int,
                   offset: int) -> float | None:
    """When the first version whose lineage covers (partition, offset) was registered."""
    for registered, offsets in windows:
        first, end = offsets.get(str(partition), [0, 0])
        if first <= offset < end:
            return registered
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog", type=int, default=64, help="pairs on the bus before the trainer starts")
    parser.add_argument("--stream", type=int, default=48, help="pairs produced while it runs")
    parser.add_argument("--rate", type=float, default=2.0, help="streamed pairs per second")
    parser.add_argument("--publish-every", type=int, default=16, help="samples per published version")
    parser.add_argument("--idle-exit", type=float, default=6.0, help="stop after this many quiet seconds")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--bootstrap", default=None, help="an existing Kafka broker (else one is started)")
    parser.add_argument("--precision", default="auto",
                        help="auto (fp32, and bf16 where auto picks it here) or comma-separated: bf16, fp32")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    base = load_settings()
    chosen = precisions(args.precision)
    results: dict[tuple[str, int], dict[str, float]] = {}
    with kafka_broker(args.bootstrap) as bootstrap:
        for precision in chosen:
            for workers in (int(w) for w in args.workers.split(",")):
                results[precision, workers] = figures = measure(base, bootstrap, workers, args, precision)
                print(f"{precision}, {workers} worker(s): {figures['samples_per_s']:.2f} samples/s, "
                      f"freshness median {figures['freshness_s']:.1f} s, "
                      f"p90 {figures['freshness_p90_s']:.1f} s ({figures['versions']} versions, "
                      f"{figures['fresh_samples']} streamed samples)", flush=True)
    main_precision = chosen[-1]  # bf16 when auto picks it here, else fp32
    out: dict[str, Any] = {"backlog": args.backlog, "stream": args.stream, "rate_per_s": args.rate,
                           "publish_every_samples": args.publish_every, "precision": main_precision}
    for (precision, workers), figures in results.items():
        for tail in ([""] if precision == main_precision else []) + [f"_{precision}"]:
            suffix = ("" if workers == 1 else f"_{workers}") + tail
            out |= {f"samples_per_s{suffix}": round(figures["samples_per_s"], 3),
                    f"freshness_s{suffix}": round(figures["freshness_s"], 2),
                    f"freshness_p90_s{suffix}": round(figures["freshness_p90_s"], 2)}
        if workers == 2 and (precision, 1) in results:
            scaling = round(figures["samples_per_s"] / results[precision, 1]["samples_per_s"], 3)
            out[f"scaling_2_vs_1_{precision}"] = scaling
            if precision == main_precision:
                out["scaling_2_vs_1"] = scaling
            print(f"{precision}: 2 workers / 1 worker: {scaling:.2f}x samples/s")
    emit(out, main_precision)


if __name__ == "__main__":
    main()
