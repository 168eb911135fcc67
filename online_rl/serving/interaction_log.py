"""Logging served interactions to the bus off the request path, with bounded buffering.

`log()` never blocks and never fails a request: it encodes the event and appends it to a bounded
buffer. A thread produces what is buffered and flushes; on failure it keeps the records and
retries, so nothing accepted into the buffer is lost while the service runs: records whose
confirmation timed out (the bus is away) are still being sent by the client, so the next flush waits
for them (and returns as soon as the bus is back); records refused outright are written again after
an exponential back-off. What a SIGKILL of the process loses is the buffer: the serving core therefore
holds an answer's last bytes until its record is confirmed (`on_logged`, at most
`inference.log_confirm_s`, and only while the bus is healthy), so an answer a client received is an
interaction on the topic. When the buffer is full a new interaction is dropped and counted (the
answer was still served). Delivery is at least once: a record the client gave up on after it had
reached the broker is written again, and the joiner de-duplicates interactions by request id.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from online_rl.bus import Bus, BusUnavailable, Producer
from online_rl.events import Interaction, encode

__all__ = ["InteractionLogger", "LogStats"]

logger = logging.getLogger(__name__)


@dataclass
class LogStats:
    logged: int = 0  # confirmed by the bus
    dropped: int = 0  # refused because the buffer was full
    failed_flushes: int = 0  # bus errors (each retried)


class InteractionLogger:
    """A bounded buffer of encoded interactions and the thread that writes them to `topic`."""

    def __init__(self, bus: Bus, topic: str, max_buffer: int = 10_000, flush_timeout_s: float = 5.0,
                 max_backoff_s: float = 10.0, batch: int = 500) -> None:
        self._producer: Producer = bus.producer()
        self._topic = topic
        self._max = max_buffer
        self._flush_timeout = flush_timeout_s
        self._max_backoff = max_backoff_s
        self._batch = batch
        self._buffer: deque[tuple[bytes, bytes, Callable[[], None] | None]] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self.stats = LogStats()
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="orl-interaction-log", daemon=True)
        self._thread.start()

    def log(self, interaction: Interaction, on_logged: Callable[[], None] | None = None) -> bool:
        """Queue `interaction` for the bus; False when the buffer is full and it was dropped.
        `on_logged` is called (from the writer thread) once the bus has confirmed it."""
        record = (interaction.request_id.encode(), encode(interaction), on_logged)
        with self._cond:
            if len(self._buffer) >= self._max or not self._thread.is_alive():
                self.stats.dropped += 1
                return False
            self._buffer.append(record)
            self._cond.notify()
        return True

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    @property
    def healthy(self) -> bool:
        """The last write was confirmed (False while the bus is away and records wait to be retried)."""
        return self.last_error is None and self._thread.is_alive()

    def _run(self) -> None:
        backoff = 0.1
        # Records at the buffer's head that a flush which timed out left on their way: the client keeps
        # retrying them, so the next flush waits for them instead of writing them again (it returns as
        # soon as the bus is back, where a back-off sleep would not notice its return).
        in_flight = 0
        while True:
            with self._cond:
                while not self._buffer and not self._closing:
                    self._cond.wait()
                if not self._buffer:
                    return
                size = in_flight or min(self._batch, len(self._buffer))
                chunk = [self._buffer[i] for i in range(size)]
            try:
                if not in_flight:
                    for key, value, _ in chunk:
                        self._producer.produce(self._topic, value, key)
                    in_flight = len(chunk)
                self._producer.flush(self._flush_timeout)
            except Exception as exc:  # the bus is down or refused: keep the records and retry
                if not isinstance(exc, BusUnavailable):
                    in_flight = 0  # refused or never queued: written again after the back-off
                self.stats.failed_flushes += 1
                self.last_error = str(exc) or type(exc).__name__
                waiting = "waiting for them" if in_flight else f"retrying in {backoff:.1f}s"
                logger.warning("interaction log: %d records not confirmed (%s); %s",
                               len(chunk), self.last_error, waiting)
                with self._cond:
                    if self._closing and backoff >= self._max_backoff:
                        return  # give up at shutdown once retries have had their time
                    # New records notify the condition: wait out the backoff regardless. (Records still
                    # on their way need no sleep: the next flush waits for them.)
                    deadline = time.monotonic() + (0 if in_flight else backoff)
                    while not self._closing and (left := deadline - time.monotonic()) > 0:
                        self._cond.wait(left)
                backoff = min(backoff * 2, self._max_backoff)
                continue
            in_flight = 0
            backoff = 0.1
            self.last_error = None
            with self._cond:
                for _ in chunk:
                    self._buffer.popleft()
                self.stats.logged += len(chunk)
            for _, _, on_logged in chunk:
                if on_logged is not None:
                    try:
                        on_logged()
                    except Exception:  # a waiter that went away (its loop closed) must not stop the log
                        logger.debug("interaction log: a confirmation callback failed", exc_info=True)

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is buffered (waiting at most `timeout_s`), then stop."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.error("interaction log: %d interactions not written at shutdown", len(self._buffer))
            return
        if self._buffer:
            logger.error("interaction log: %d interactions not written at shutdown", len(self._buffer))
        self._producer.close()
