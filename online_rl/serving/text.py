"""Token ids to streamed text: the engines stream ids, clients want text as it grows.

Decoding a growing id list one token at a time can cut a multi-byte character or a word piece in
half; `IncrementalText` re-decodes a short window behind the last emitted position and releases
text only once it is stable (no trailing U+FFFD replacement character).
"""

from __future__ import annotations

from typing import Any

__all__ = ["IncrementalText"]


class IncrementalText:
    """Turns token ids, pushed in order, into text deltas."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # start of the window that is re-decoded for context
        self._read = 0  # ids before this have been emitted as text

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))

    def push(self, token_ids: list[int]) -> str:
        """Add ids; return the text they completed (possibly empty)."""
        self._ids.extend(token_ids)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]

    def flush(self) -> str:
        """The text still held back at the end of the sequence."""
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return after[len(before) :] if len(after) > len(before) else ""
