"""Writing to the bus from async request handlers, with group commit.

Handlers `await writer.write(records)`; a writer thread takes everything queued, produces it and
flushes once, then resolves every waiting handler: one broker round trip confirms many requests.
A handler is answered only after its records are confirmed (acks=all), or with `BusUnavailable`
when confirmation does not come within `timeout_s` (the records may still arrive later; clients
retry with the same event ids, which the join de-duplicates).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from online_rl.bus import Bus, BusUnavailable, Producer

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
    on_confirmed: Callable[[], None] | None = None
    abandoned: bool = False  # the handler gave up waiting: do not start it any more


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
        self.last_error_at = 0.0  # time.monotonic() of the last failed write
        self._thread.start()

    async def write(
        self, records: Sequence[OutRecord], on_confirmed: Callable[[], None] | None = None
    ) -> None:
        """Return once `records` are confirmed; raises `BusUnavailable` otherwise.

        `on_confirmed` runs in the writer thread whenever the records are confirmed, even after
        this call gave up waiting (a late confirmation still counts, e.g. for de-duplication)."""
        if not self._thread.is_alive():
            raise BusUnavailable("the bus writer has stopped; restart the service")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        job = _Job(records, future, loop, on_confirmed)
        self._jobs.put(job)
        try:
            await asyncio.wait_for(asyncio.shield(future), self._timeout + 1.0)
        except TimeoutError as exc:
            job.abandoned = True
            raise BusUnavailable(f"the bus did not confirm the write within {self._timeout:g}s") from exc

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def recent_error(self, within_s: float) -> str | None:
        """The last write's error if a write failed less than `within_s` seconds ago and none has
        succeeded since: a failure is news for a while, not for ever (with no traffic, no later write
        could ever clear it)."""
        if self.last_error is None or time.monotonic() - self.last_error_at >= within_s:
            return None
        return self.last_error

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
            jobs = [job for job in self._take_batch(first) if not job.abandoned]
            if not jobs:
                continue
            try:
                for job in jobs:
                    for record in job.records:
                        self._producer.produce(record.topic, record.value, record.key)
                self._producer.flush(self._timeout)
            except Exception as exc:  # any failure fails these requests, never the thread
                self.last_error = str(exc) or type(exc).__name__
                self.last_error_at = time.monotonic()
                logger.warning("bus write failed for %d requests: %s", len(jobs), exc)
                for job in jobs:
                    _resolve(job, exc)
                continue
            self.last_error = None
            for job in jobs:
                if job.on_confirmed is not None:
                    job.on_confirmed()
                _resolve(job, None)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=self._timeout + 5)
        if not self._thread.is_alive():  # never close the producer under a running flush
            self._producer.close()


def _resolve(job: _Job, error: BaseException | None) -> None:
    with contextlib.suppress(RuntimeError):  # a closed event loop: nobody is waiting any more
        job.loop.call_soon_threadsafe(_settle, job.future, error)


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(BusUnavailable(f"the bus did not confirm the write: {error}"))


class RecentIds:
    """The most recent confirmed event ids (bounded), to answer retries without writing again.

    Filled from the writer thread, read from the event loop: guarded by a lock."""

    def __init__(self, capacity: int = 200_000) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def __contains__(self, event_id: object) -> bool:
        with self._lock:
            return event_id in self._ids

    def add_all(self, event_ids: Sequence[str]) -> None:
        with self._lock:
            for event_id in event_ids:
                self._ids[event_id] = None
            while len(self._ids) > self._capacity:
                self._ids.popitem(last=False)
