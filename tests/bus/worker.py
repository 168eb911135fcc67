"""A consumer process for the kill-and-restart test.

It processes records one at a time (appending `partition offset` to a file and fsyncing), commits
every `--every` records, and logs each commit after it returns. The test SIGKILLs it mid-batch.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from online_rl.bus.embedded import EmbeddedBus
from online_rl.bus.kafka import KafkaBus


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["embedded", "kafka"], required=True)
    parser.add_argument("--where", required=True, help="SQLite path or bootstrap servers")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--every", type=int, default=7)
    parser.add_argument("--delay", type=float, default=0.01)
    args = parser.parse_args()

    bus = EmbeddedBus(Path(args.where)) if args.backend == "embedded" else KafkaBus(args.where)
    consumer = bus.consumer(args.group)
    consumer.subscribe([args.topic])
    processed = (args.out / "processed").open("a")
    commits = (args.out / "commits").open("a")
    pending = []
    while True:
        for record in consumer.poll(50, 0.5):
            processed.write(f"{os.getpid()} {record.partition} {record.offset}\n")
            processed.flush()
            os.fsync(processed.fileno())
            pending.append(record)
            time.sleep(args.delay)
            if len(pending) >= args.every:
                offsets = consumer.next_offsets(pending)
                consumer.commit(offsets)
                for tp, offset in offsets.items():
                    commits.write(f"{os.getpid()} {tp.partition} {offset}\n")
                commits.flush()
                os.fsync(commits.fileno())
                pending = []


if __name__ == "__main__":
    main()
