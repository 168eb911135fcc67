"""Checks every OpenAI-compatible service's edge must pass: bodies over the limit and keys over their rate."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import psutil

GIB = 1 << 30


def huge_body_is_refused_fast_and_small(url: str, headers: dict[str, str]) -> None:
    """A 1 GiB body, announced by its Content-Length or streamed in chunks, is refused in under a second
    (announced) or two (streamed: the sending client shares this process, and its interpreter lock, with
    the servers) without the process growing by more than 50 MB."""
    process = psutil.Process()
    chunk = b"x" * (1 << 20)

    def stream() -> Iterator[bytes]:
        for _ in range(GIB // len(chunk)):
            yield chunk

    for announced in (True, False):
        before = process.memory_info().rss
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
        print(f"1 GiB body (announced: {announced}) refused in {elapsed:.2f} s, the process grew "
              f"{(peak[0] - before) / 1e6:.1f} MB")
        assert elapsed < (1.0 if announced else 2.0), f"{elapsed:.2f} s to refuse a 1 GiB body ({announced=})"
        assert peak[0] - before < 50e6, f"grew by {(peak[0] - before) / 1e6:.0f} MB (announced: {announced})"
        if response is not None:
            assert response.status_code == 413, response.text
            assert response.json()["error"]["code"] == "request_too_large"
