"""Checks every OpenAI-compatible service's edge must pass: bodies over the limit and keys over their rate."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import psutil

GIB = 1 << 30


def huge_body_is_refused_early_and_small(url: str, headers: dict[str, str]) -> None:
    """A 1 GiB body, announced by its Content-Length or streamed in chunks, is refused after the client
    could send at most 64 MiB of it (the limit plus what socket buffers hold), without the process (the
    servers run in it) growing by more than 50 MB. The time it takes is bench/hostile.py's figure
    (`huge_body_refused_s`)."""
    process = psutil.Process()
    chunk = b"x" * (1 << 20)

    sent = [0]

    def stream() -> Iterator[bytes]:
        for _ in range(GIB // len(chunk)):
            sent[0] += len(chunk)
            yield chunk

    for announced in (True, False):
        before, sent[0] = process.memory_info().rss, 0
        peak = [before]
        done = threading.Event()

        def watch(done: threading.Event, peak: list[int]) -> None:
            while not done.is_set():
                peak[0] = max(peak[0], process.memory_info().rss)
                time.sleep(0.01)

        watcher = threading.Thread(target=watch, args=(done, peak), daemon=True)
        watcher.start()
        start = time.perf_counter()
        extra = {"content-length": str(GIB), "content-type": "application/json"} if announced else {
            "content-type": "application/json"}
        try:
            response = httpx.post(url, headers=headers | extra, content=stream(), timeout=30)
        except httpx.TransportError:  # the server answered 413 and closed while the client still sent
            response = None
        elapsed = time.perf_counter() - start
        done.set()
        watcher.join()
        print(f"1 GiB body (announced: {announced}) refused in {elapsed:.2f} s after {sent[0] >> 20} MiB "
              f"sent, the process grew {(peak[0] - before) / 1e6:.1f} MB")
        assert sent[0] <= 64 << 20, f"the client sent {sent[0] >> 20} MiB before the refusal ({announced=})"
        assert peak[0] - before < 50e6, f"grew by {(peak[0] - before) / 1e6:.0f} MB (announced: {announced})"
        if response is not None:
            assert response.status_code == 413, response.text
            assert response.json()["error"]["code"] == "request_too_large"
