"""A small Python client of the feedback API, with retries and batching.

    client = FeedbackClient("http://127.0.0.1:8082", api_key="orl_...")
    client.thumbs(request_id, user_id="u1", up=True)
    client.send_many(events)          # split into batches of the server's maximum

Every event gets a client-side `event_id` before the first attempt, so a retry (after a 503, a 429,
or a dropped connection) repeats the same id and is counted once. Retries wait as the server's
Retry-After says (with exponential back-off otherwise) and give up after `max_attempts`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

import httpx
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from online_rl.errors import FeedbackRejected  # exported here too: the client's one error

__all__ = ["FeedbackClient", "FeedbackRejected"]

_RETRY_STATUS = {429, 502, 503, 504}


class _Retryable(Exception):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, _Retryable | httpx.TransportError)


def _wait(state: RetryCallState) -> float:
    backoff = wait_exponential(multiplier=0.2, max=10)(state)
    outcome = state.outcome
    exc = outcome.exception() if outcome is not None else None
    if isinstance(exc, _Retryable):
        header = exc.response.headers.get("retry-after", "")
        if header.replace(".", "", 1).isdigit():
            return min(float(header), 30.0)
    return backoff


class FeedbackClient:
    """Posts feedback events to the API."""

    def __init__(self, base_url: str, api_key: str, timeout: float = 10.0, max_attempts: int = 8,
                 batch_size: int = 500) -> None:
        self._http = httpx.Client(base_url=base_url, timeout=timeout,
                                  headers={"Authorization": f"Bearer {api_key}"})
        self._max_attempts = max_attempts
        self.batch_size = batch_size

    def __enter__(self) -> FeedbackClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        retrying = Retrying(
            retry=retry_if_exception(_retryable),
            wait=_wait,
            stop=stop_after_attempt(self._max_attempts),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    response = self._http.post(path, json=body)
                    if response.status_code in _RETRY_STATUS:
                        raise _Retryable(response)
        except _Retryable as exc:  # still refused after every attempt: the API's answer, as for a 4xx
            response = exc.response
        if response.status_code >= 400:
            try:
                payload: Any = response.json()
            except ValueError:
                payload = response.text
            raise FeedbackRejected(response.status_code, payload)
        result: dict[str, Any] = response.json()
        return result

    @staticmethod
    def _with_id(event: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(event)
        out.setdefault("event_id", uuid.uuid4().hex)
        return out

    def send(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """Post one event (a dict of `Feedback` fields); returns the API's answer."""
        return self._post("/v1/feedback", self._with_id(event))

    def send_many(self, events: Iterable[Mapping[str, Any]]) -> int:
        """Post events in batches; returns how many the API wrote now (repeats excluded)."""
        pending = [self._with_id(e) for e in events]
        written = 0
        for start in range(0, len(pending), self.batch_size):
            answer = self._post("/v1/feedback/batch", {"events": pending[start : start + self.batch_size]})
            written += int(answer["accepted"])
        return written

    def thumbs(self, request_id: str, user_id: str, up: bool, **extra: Any) -> dict[str, Any]:
        return self.send({"request_id": request_id, "user_id": user_id, "kind": "thumbs",
                          "value": 1 if up else -1, **extra})

    def rating(self, request_id: str, user_id: str, value: float, scale: tuple[float, float] = (1, 5),
               **extra: Any) -> dict[str, Any]:
        return self.send({"request_id": request_id, "user_id": user_id, "kind": "rating",
                          "value": value, "scale": list(scale), **extra})

    def prefer(self, request_id: str, other_request_id: str, user_id: str, winner: str = "this",
               **extra: Any) -> dict[str, Any]:
        return self.send({"request_id": request_id, "other_request_id": other_request_id,
                          "user_id": user_id, "kind": "preference", "winner": winner, **extra})
