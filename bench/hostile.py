"""Hostile input through the real consumers (issue 23): what a careless or hostile client can write
to the topics, and what it can ship as a version.

    python bench/hostile.py [--bootstrap HOST:PORT] [--records 10000] [--rounds 2] [--phase-s 10]
                            [--model DIR] [--smoke]

1. Records. Hypothesis generates `--records` records per topic (interactions, feedback, samples):
   raw bytes, arbitrary MessagePack, valid events with one field replaced by anything, valid events
   with extreme values (NaN, infinities, 2^64, timestamps 1e12 and -1e12, text up to 200 KB) and
   valid events. They go to a real Kafka broker and through the consumers the components run: the
   joiner (`Joiner`, interactions and feedback) and the trainer's sample stream (`Stream.from_topic`).
   Every record `events.decode` refuses must reach `orl.dlq` with its reason (`dlq_share` = the share
   that did), and no consumer may raise (`crashes`).
2. Time. A steady stream of answers and thumbs (wall-clock dated) runs through the joiner; halfway,
   one feedback event dated 1e6 s ahead is written straight to the topic (as a skewed or hostile
   producer could). Each thumb comes 1 s after its answer, inside the 3 s window.
   `samples_rate_after_future_event` is the joined samples per second after the event over before it.
   The control is the joiner before issue 23, whose watermark followed event times: every open window
   closes at once and the thumbs on their way come too late. The two sides alternate over `--rounds`.
3. Weights. An inference service (the real `online-rl serve inference`) that trusts one signer is
   asked to load five versions from a real MLflow registry: the trainer's, an unsigned one, one
   signed by another key, one whose weights were changed after signing (hashes rewritten to match),
   and one whose source lies outside its run. `forged_versions_loaded` counts the forgeries it
   loaded (0); `genuine_versions_loaded` (1) shows the check is not refusing everything.
4. Size. The same service is sent a 1 GiB chat request, once announced by its Content-Length and
   once streamed in chunks: `huge_body_refused_s` is the longer time to the refusal (413, or the
   connection closed on a streamed body), `huge_body_sent_mib` the most the client got out.

The last line is one JSON object with the figures in `FIELDS`.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `online_rl` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import alternated, emit, kafka_broker, put_spread, start_cli_service

FIELDS = ("records", "rejects", "crashes", "dlq_share", "dlq_reasons", "samples_rate_before",
          "samples_rate_after_future_event", "control_rate_after_future_event", "forged_versions_loaded",
          "genuine_versions_loaded", "huge_body_refused_s", "huge_body_sent_mib")
TOPICS = ("interactions", "feedback", "samples")


# -- 1. records ---------------------------------------------------------------------------------------

def _valid_bodies() -> dict[str, list[dict[str, Any]]]:
    """One valid wire body per event shape, per topic (what the mutations start from)."""
    import msgspec

    from online_rl.events import (
        Completion,
        Feedback,
        FeedbackKind,
        Interaction,
        Message,
        TrainingSample,
        encode,
    )

    prompt = [Message(role="user", content="Say hi")]
    interaction = Interaction(request_id="r1", user_id="u1", created_at=100.0, model="m",
                              adapter_version=None, prompt=prompt, prompt_token_ids=[1, 2, 3],
                              completion="hi", completion_token_ids=[7, 8], completion_logprobs=[-0.1, -0.2])
    thumbs = Feedback(event_id="e1", request_id="r1", user_id="u1", created_at=101.0,
                      kind=FeedbackKind.thumbs, value=1.0)
    rating = Feedback(event_id="e2", request_id="r1", user_id="u1", created_at=101.0,
                      kind=FeedbackKind.rating, value=4.0, scale=(1.0, 5.0))
    pref = Feedback(event_id="e3", request_id="r1", user_id="u1", created_at=102.0,
                    kind=FeedbackKind.preference, other_request_id="r2", winner="this")
    completion = Completion(request_id="r1", text="hi", token_ids=[7, 8], logprobs=[-0.1, -0.2])
    single = TrainingSample(sample_id="s1", kind="single", model="m", user_id="u1", prompt=prompt,
                            prompt_token_ids=[1, 2, 3], completion=completion, reward=1.0,
                            feedback_kind=FeedbackKind.thumbs, reward_mapping_version="v",
                            behaviour_versions=[None], created_at=100.0)
    pair = TrainingSample(sample_id="s2", kind="pair", model="m", user_id="u1", prompt=prompt,
                          prompt_token_ids=[1, 2, 3], chosen=completion, rejected=completion,
                          feedback_kind=FeedbackKind.preference, reward_mapping_version="v",
                          behaviour_versions=[None, None], created_at=100.0)
    body = lambda event: msgspec.msgpack.decode(encode(event)[1:])  # noqa: E731
    return {"interactions": [body(interaction)], "feedback": [body(thumbs), body(rating), body(pref)],
            "samples": [body(single), body(pair)]}


def _strategy(topic: str) -> Any:
    """Hypothesis: one hostile (or valid) record for `topic`, as bytes."""
    import msgspec
    from hypothesis import strategies as st

    ints = st.integers(-2**63, 2**64 - 1)  # what MessagePack can carry
    leaves = st.none() | st.booleans() | ints | st.floats() | st.text(max_size=20) | st.binary(max_size=20)
    anything = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4)
                            | st.dictionaries(st.text(max_size=8) | ints, inner, max_size=4), max_leaves=12)
    extreme = st.sampled_from([math.nan, math.inf, -math.inf, 2**64 - 1, -2**63, 1e308, 1e12, -1e12, 0.0,
                               [2**63], [-1], [math.nan], ""]) \
        | st.integers(10_000, 200_000).map(lambda n: "x" * n)
    valid = _valid_bodies()[topic]
    fields = sorted({k for body in valid for k in body})

    @st.composite
    def record(draw: Any) -> bytes:
        choice = draw(st.sampled_from(["raw", "msgpack", "mutated", "extreme", "valid"]))
        if choice == "raw":
            return bytes(draw(st.binary(max_size=256)))
        if choice == "msgpack":
            return b"\x01" + msgspec.msgpack.encode(draw(anything))
        body = dict(draw(st.sampled_from(valid)))
        body["request_id" if "request_id" in body else "sample_id"] = f"h{draw(st.integers(0, 10**9))}"
        if choice != "valid":
            body[draw(st.sampled_from(fields))] = draw(anything if choice == "mutated" else extreme)
        return b"\x01" + msgspec.msgpack.encode(body)

    return record()


def hostile_records(topic: str, count: int, seed: int = 0) -> list[bytes]:
    """`count` records for `topic`, drawn by Hypothesis (reproducible for a seed)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    out: list[bytes] = []
    strategy = _strategy(topic)
    round_ = 0
    while len(out) < count:  # Hypothesis may stop early when it thinks it has seen enough
        @hypothesis_seed(seed * 1000 + round_)
        @settings(max_examples=count - len(out), database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def collect(data: bytes) -> None:
            out.append(data)

        collect()
        round_ += 1
    return out[:count]


def _rejected(data: bytes, topic: str, key: bytes, partitions: int) -> bool:
    """Whether the consumer must dead-letter the record: it does not decode, or (the joiner's inputs)
    its request id belongs on another partition than its key put it on (the join would never meet its
    other half there)."""
    from online_rl.bus import partition_for
    from online_rl.errors import DecodeError
    from online_rl.events import Feedback, Interaction, TrainingSample, decode

    kind: Any = {"interactions": Interaction, "feedback": Feedback, "samples": TrainingSample}[topic]
    try:
        event = decode(data, kind)
    except DecodeError:
        return True
    if topic in ("interactions", "feedback"):
        return bool(partition_for(event.request_id.encode(), partitions) != partition_for(key, partitions))
    return False


def run_records(bootstrap: str, count: int, seed: int = 0, partitions: int = 2) -> dict[str, Any]:
    """Write `count` generated records per topic and run the joiner and the trainer's sample stream
    over them; returns records, rejects, crashes, dlq_share and the DLQ reasons seen."""
    from online_rl.bus import Topics, ensure_topics
    from online_rl.bus.kafka import KafkaBus
    from online_rl.stream import JoinConfig, Joiner, Stream

    bus = KafkaBus(bootstrap)
    topics = Topics(prefix=f"hostile{uuid.uuid4().hex[:8]}")
    ensure_topics(bus, topics, partitions)
    producer = bus.producer()
    expected: dict[tuple[str, str], bool] = {}  # (topic, key) -> rejected by decode
    started = time.monotonic()
    for topic in TOPICS:
        name = getattr(topics, topic)
        for i, data in enumerate(hostile_records(topic, count, seed)):
            key = f"{topic}-{i}"
            expected[(name, key)] = _rejected(data, topic, key.encode(), partitions)
            producer.produce(name, data, key.encode())
        producer.flush(120)
    print(f"  wrote {len(expected)} records in {time.monotonic() - started:.1f} s", flush=True)
    # where the generated samples end (the joiner's transactional output, markers and all, comes after)
    ends = bus.end_offsets(topics.samples)

    crashes: list[str] = []
    now = time.time()
    joiner = Joiner(bus, JoinConfig(window_s=1.0, retention_s=10.0), group_id=f"j-{topics.prefix}",
                    transactional_id=f"j-{topics.prefix}", clock=lambda: now, topics=topics)
    _until_idle(lambda: joiner.step(max_records=500, timeout=0.5).consumed, joiner.caught_up, crashes)
    joiner.close()

    stream: Stream[Any] = Stream.from_topic(topics.samples, bus, group_id=f"t-{topics.prefix}",
                                            dlq_topic=topics.dlq, start_missing_at=0)
    seen: dict[Any, int] = {}
    deadline = time.monotonic() + 300
    try:
        for batch in stream.batch(64, timeout=0.5, idle_batches=True):
            seen.update({tp: max(seen.get(tp, 0), off) for tp, off in batch.offsets.items()})
            if all(seen.get(tp, 0) >= end for tp, end in ends.items()) or time.monotonic() > deadline:
                break
    except Exception as exc:  # a crash of the trainer's consumer: counted, not hidden
        crashes.append(f"samples stream: {type(exc).__name__}: {exc}")
    finally:
        stream.close()

    dead: dict[tuple[str, str], str] = {}
    for record in bus.read_all(topics.dlq):
        from_topic = (record.header("source.topic") or b"").decode()
        dead[(from_topic, (record.key or b"").decode())] = (record.header("reason") or b"").decode()
    rejects = [k for k, rejected in expected.items() if rejected]
    reached = [k for k in rejects if dead.get(k)]
    reasons: dict[str, int] = {}
    for reached_key in reached:
        reason = ": ".join(dead[reached_key].split(": ")[:2])[:48]  # the error and its first clause
        reasons[reason] = reasons.get(reason, 0) + 1
    bus.close()
    return {"records": len(expected), "rejects": len(rejects), "crashes": len(crashes),
            "crash_messages": crashes[:3], "dlq_share": round(len(reached) / max(1, len(rejects)), 4),
            "dlq_extra": len(dead) - len(reached),
            "dlq_reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])[:8]),
            "per_topic_rejects": {t: sum(1 for (name, _), r in expected.items() if r and name.endswith(t))
                                  for t in TOPICS}}


def _until_idle(step: Callable[[], int], caught_up: Callable[[], bool], crashes: list[str],
                limit_s: float = 600) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if step() == 0 and caught_up():
                return
        except Exception as exc:  # the consumer would die here: count it and stop
            crashes.append(f"joiner: {type(exc).__name__}: {exc}")
            return


# -- 2. time ------------------------------------------------------------------------------------------

def _unbounded_joiner() -> type:
    """The control: the joiner as it was before issue 23, whose watermark followed event times (a
    future-dated event moved it, and every open window closed)."""
    from online_rl.stream import Joiner

    class Unbounded(Joiner):
        def _bounded(self, task: Any, event: Any, ahead: float) -> Any:
            return event

        def _watermark_limit(self) -> float:
            return math.inf

    return Unbounded


def run_future_event(bootstrap: str, control: bool, phase_s: float, rate: float = 20.0,
                     delay_s: float = 1.0) -> tuple[float, float]:
    """Joined samples per second before and after one feedback event dated 1e6 s ahead, through the
    joiner (or, with `control`, the joiner before issue 23)."""
    from online_rl.bus import Topics, ensure_topics
    from online_rl.bus.kafka import KafkaBus
    from online_rl.events import Feedback, FeedbackKind, Interaction, Message, encode
    from online_rl.stream import JoinConfig, Joiner

    bus = KafkaBus(bootstrap)
    topics = Topics(prefix=f"future{uuid.uuid4().hex[:8]}")
    ensure_topics(bus, topics, 2)
    stop = threading.Event()

    lag = max(1, round(rate * delay_s))

    def users() -> None:
        """Answers at `rate` per second, dated by the wall clock; each one's thumb comes `delay_s`
        later (a user reads first), well inside the join window."""
        producer = bus.producer()
        i = 0
        while not stop.is_set():
            now = time.time()
            rid = f"s{i}"
            producer.produce(topics.interactions, encode(Interaction(
                request_id=rid, user_id="u1", created_at=now, model="m", adapter_version=None,
                prompt=[Message(role="user", content="hi")], prompt_token_ids=[1], completion="hey",
                completion_token_ids=[2], completion_logprobs=[-0.5])), rid.encode())
            if i >= lag:
                judged = f"s{i - lag}"
                producer.produce(topics.feedback, encode(Feedback(
                    event_id=f"e{i - lag}", request_id=judged, user_id="u1", created_at=now,
                    kind=FeedbackKind.thumbs, value=1.0)), judged.encode())
            producer.flush()
            i += 1
            stop.wait(max(0.0, 1.0 / rate - (time.time() - now)))

    writer = threading.Thread(target=users, daemon=True)
    writer.start()
    kind = _unbounded_joiner() if control else Joiner
    joiner = kind(bus, JoinConfig(window_s=3.0, retention_s=30.0), group_id=f"j-{topics.prefix}",
                  transactional_id=f"j-{topics.prefix}", topics=topics)

    def run_for(seconds: float) -> int:
        before = joiner.stats.get("joined", 0)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            joiner.step(max_records=500, timeout=0.2)
        return int(joiner.stats.get("joined", 0) - before)

    try:
        run_for(6.0)  # warm-up: the group joins, the first windows close
        before = run_for(phase_s)
        producer = bus.producer()
        producer.produce(topics.feedback, encode(Feedback(
            event_id="future", request_id="s1", user_id="u1", created_at=time.time() + 1e6,
            kind=FeedbackKind.thumbs, value=-1.0)), b"s1")
        producer.flush()
        after = run_for(phase_s)
    finally:
        stop.set()
        writer.join(10)
        joiner.close()
        bus.close()
    return before / phase_s, after / phase_s


# -- 3. weights ---------------------------------------------------------------------------------------

def _adapter(model_dir: Path, out: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    peft.save_pretrained(str(out))
    return out


def _huge_body(url: str, key: str) -> tuple[float, float]:
    """(seconds to the refusal, MiB sent) of a 1 GiB chat body, the worse of announced and streamed."""
    import httpx

    chunk, gib = b"x" * (1 << 20), 1 << 30
    worst_s, worst_mib = 0.0, 0.0
    for announced in (True, False):
        sent = [0]

        def body(sent: list[int] = sent) -> Any:
            for _ in range(gib // len(chunk)):
                sent[0] += len(chunk)
                yield chunk

        headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
        if announced:
            headers["content-length"] = str(gib)
        start = time.perf_counter()
        try:
            status = httpx.post(url + "/v1/chat/completions", headers=headers, content=body(),
                                timeout=60).status_code
        except httpx.TransportError:  # answered 413 and closed while the client still sent
            status = 413
        elapsed = time.perf_counter() - start
        print(f"  1 GiB body (announced: {announced}): {status} in {elapsed:.2f} s, "
              f"{sent[0] >> 20} MiB sent", flush=True)
        if status != 413:
            raise SystemExit(f"a 1 GiB body got {status}, not 413")
        worst_s, worst_mib = max(worst_s, elapsed), max(worst_mib, sent[0] / (1 << 20))
    return round(worst_s, 3), round(worst_mib, 1)


def run_forged(model_dir: Path, model_name: str, work: Path,
               port: int = 18591) -> tuple[int, int, float, float]:
    """(forgeries loaded, genuine versions loaded) by a real inference service that trusts one signer,
    then the time and bytes it took that service to refuse a 1 GiB body (`_huge_body`)."""
    import httpx
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from online_rl.config import Settings
    from online_rl.ingest import new_key
    from online_rl.registry import new_signing_key, write_lineage
    from online_rl.tracking import ensure_experiment, mlflow_client

    tracking = f"sqlite:///{work / 'mlflow.db'}"
    settings = Settings(cache_dir=work / "cache", mlflow={"tracking_uri": tracking})  # type: ignore[arg-type]
    client = mlflow_client(settings)
    experiment = ensure_experiment(client, "adapters", settings)
    client.create_registered_model("policy")
    pem, trusted = new_signing_key()
    base = _adapter(model_dir, work / "base-adapter")

    def version(name: str, key: bytes | None, tamper: bool = False, outside: bool = False) -> str:
        folder = shutil.copytree(base, work / name)
        write_lineage(folder, model_name, load_pem_private_key(key, None) if key else None)  # type: ignore[arg-type]
        if tamper:  # weights changed after signing, the manifest's hash rewritten to match
            weights = folder / "adapter_model.safetensors"
            data = bytearray(weights.read_bytes())
            data[-1] ^= 0xFF
            weights.write_bytes(bytes(data))
            manifest = json.loads((folder / "lineage.json").read_text())
            from online_rl.registry.lineage import file_sha256

            manifest["files"]["adapter_model.safetensors"] = file_sha256(weights)
            (folder / "lineage.json").write_text(json.dumps(manifest))
        run = client.create_run(experiment)
        client.log_artifacts(run.info.run_id, str(folder), "adapter")
        source = str(folder) if outside else f"{run.info.artifact_uri}/adapter"
        return str(client.create_model_version("policy", source=source, run_id=run.info.run_id).version)

    forged = [version("unsigned", None), version("foreign", new_signing_key()[0]),
              version("tampered", pem, tamper=True), version("outside", pem, outside=True)]
    genuine = [version("genuine", pem)]
    admin, digest = new_key()
    env = {"ORL_CACHE_DIR": str(work / "cache"), "ORL_MODEL__PATH": str(model_dir),
           "ORL_MODEL__NAME": model_name,
           "ORL_KAFKA__BOOTSTRAP_SERVERS": "", "ORL_BUS__EMBEDDED_PATH": str(work / "bus.db"),
           "ORL_MLFLOW__TRACKING_URI": tracking, "ORL_MLFLOW__TRUSTED_SIGNERS": trusted,
           "ORL_INFERENCE__ENGINE": "transformers",
           "ORL_INFERENCE__API_KEYS": json.dumps([f"{digest} inference,admin"])}
    url = f"http://127.0.0.1:{port}"
    server = start_cli_service(["serve", "inference", "--port", str(port)], env, url, "inference service")
    try:
        def loads(number: str) -> bool:
            got = httpx.post(url + "/admin/adapters", json={"source": f"models:/policy/{number}"},
                             headers={"Authorization": f"Bearer {admin}"}, timeout=300)
            print(f"  version {number}: {got.status_code} {got.text[:140]}", flush=True)
            return got.status_code == 201

        loaded = sum(loads(v) for v in forged), sum(loads(v) for v in genuine)
        return (*loaded, *_huge_body(url, admin))
    finally:
        server.terminate()
        server.wait(30)


# -- the run ------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="a running Kafka broker (default: start one for the run)")
    parser.add_argument("--records", type=int, default=10_000, help="generated records per topic")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the future-event comparison")
    parser.add_argument("--phase-s", type=float, default=10.0, help="seconds before and after the event")
    parser.add_argument("--model", type=Path, help="the model folder (default: the embedded model)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="a short run that checks the benchmark works")
    args = parser.parse_args()
    if args.smoke:
        args.records, args.rounds, args.phase_s = 200, 1, 3.0
    from online_rl.config import load_settings

    settings = load_settings()
    model_dir = args.model or settings.model_dir
    model_name = settings.model.name if args.model is None else args.model.name
    result: dict[str, Any] = {}
    with kafka_broker(args.bootstrap) as bootstrap:
        print(f"1. {args.records} generated records per topic through the joiner and the sample stream",
              flush=True)
        result |= run_records(bootstrap, args.records, args.seed)
        print(f"  {result['rejects']} rejects, {result['crashes']} crashes, dlq_share {result['dlq_share']}",
              flush=True)
        print(f"2. one feedback event dated 1e6 s ahead: {args.rounds} rounds of {args.phase_s:.0f} s phases",
              flush=True)
        ratios: dict[str, list[float]] = {"bounded": [], "control": []}
        befores: list[float] = []
        for r, order in enumerate(alternated(args.rounds, list(ratios))):
            for side in order:
                before, after = run_future_event(bootstrap, side == "control", args.phase_s)
                ratios[side].append(after / before if before else 0.0)
                if side == "bounded":
                    befores.append(before)
                print(f"  round {r + 1} {side:7s}: {before:5.1f} -> {after:5.1f} samples/s", flush=True)
        put_spread(result, "samples_rate_after_future_event", ratios["bounded"])
        put_spread(result, "control_rate_after_future_event", ratios["control"])
        put_spread(result, "samples_rate_before", befores, 1)
    print("3-4. forged versions and a 1 GiB body against a real inference service that trusts one signer",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="orl-bench-hostile-") as tmp:
        (result["forged_versions_loaded"], result["genuine_versions_loaded"], result["huge_body_refused_s"],
         result["huge_body_sent_mib"]) = run_forged(model_dir, model_name, Path(tmp))
    emit(result, "fp32")


if __name__ == "__main__":
    main()
