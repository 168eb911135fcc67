"""Writing to the bus from async request handlers, with group commit.

Handlers `await writer.write(records)`; a writer thread takes everything queued, produces it and
flushes once, then resolves every waiting handler: one broker round trip confirms many requests.
A handler is answered only after its records are confirmed (acks=all), or with `BusUnavailable`
when confirmation does not come within `timeout_s` (the records may still arrive later; clients
retry with the same event ids, which the join de-duplicates).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from online_rl.bus import Bus, BusError, BusUnavailable, Producer

__all__ = ["AsyncBusWriter", "OutRecord", "RecentIds"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OutRecord:
    topic: str
    key: bytes
    value: bytes


@dataclass
class _Job:
    records: Sequence[OutRecord]
    future: asyncio.Future[None]
    loop: asyncio.AbstractEventLoop


class AsyncBusWriter:
    """Group-commit writer over one producer, owned by one thread."""

    def __init__(self, bus: Bus, timeout_s: float = 5.0, max_batch: int = 5000) -> None:
        self._bus = bus
        self._producer: Producer = bus.producer()
        self._timeout = timeout_s
        self._max_batch = max_batch
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="orl-bus-writer", daemon=True)
        self.last_error: str | None = None
        self.last_ok = 0.0
        self._thread.start()

    async def write(self, records: Sequence[OutRecord]) -> None:
        """Return once `records` are confirmed; raises `BusUnavailable` otherwise."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._jobs.put(_Job(records, future, loop))
        try:
            return await asyncio.wait_for(asyncio.shield(future), self._timeout + 1.0)
        except TimeoutError as exc:
            raise BusUnavailable(f"the bus did not confirm the write within {self._timeout:g}s") from exc

    def _take_batch(self, first: _Job) -> list[_Job]:
        jobs, count = [first], len(first.records)
        while count < self._max_batch:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self._jobs.put(None)
                break
            jobs.append(job)
            count += len(job.records)
        return jobs

    def _run(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            jobs = self._take_batch(first)
            try:
                for job in jobs:
                    for record in job.records:
                        self._producer.produce(record.topic, record.value, record.key)
                self._producer.flush(self._timeout)
            except BusError as exc:
                self.last_error = str(exc)
                logger.warning("bus write failed for %d requests: %s", len(jobs), exc)
                for job in jobs:
                    job.loop.call_soon_threadsafe(_fail, job.future, exc)
                continue
            self.last_ok, self.last_error = time.monotonic(), None
            for job in jobs:
                job.loop.call_soon_threadsafe(_succeed, job.future)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=self._timeout + 5)
        self._producer.close()


def _succeed(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _fail(future: asyncio.Future[None], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(BusUnavailable(f"the bus did not confirm the write: {exc}"))


class RecentIds:
    """The most recent confirmed event ids (bounded), to answer retries without writing again."""

    def __init__(self, capacity: int = 200_000) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._ids

    def add(self, event_id: str) -> None:
        self._ids[event_id] = None
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
