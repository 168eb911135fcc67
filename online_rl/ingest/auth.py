"""API keys, stored only as SHA-256 hashes (in the config or a mounted Secret file).

An entry is `<sha256 hex>` (every scope) or `<sha256 hex> <scope>[,<scope>...]`. A raw key is
shown once, when `online-rl keys new` makes it; only its hash is ever stored.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from online_rl.errors import ConfigError, OnlineRLError

__all__ = ["ApiKeyStore", "Forbidden", "KeyInfo", "Unauthenticated", "authorize", "hash_key", "new_key"]

_ALL = "*"


def hash_key(raw: str) -> str:
    """The stored form of a raw API key."""
    return hashlib.sha256(raw.encode()).hexdigest()


def new_key() -> tuple[str, str]:
    """A fresh raw key (shown to the user once) and its hash (to store)."""
    raw = "orl_" + secrets.token_urlsafe(32)
    return raw, hash_key(raw)


@dataclass(frozen=True)
class KeyInfo:
    """Who a verified key is: a short id (hash prefix, safe to log) and its scopes."""

    key_id: str
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        return _ALL in self.scopes or scope in self.scopes


class ApiKeyStore:
    """Verifies raw keys against stored hashes."""

    def __init__(self, entries: Iterable[str]) -> None:
        self._keys: dict[str, KeyInfo] = {}
        for number, entry in enumerate(entries, 1):
            line = entry.split("#", 1)[0].strip()
            if not line:
                continue
            digest, _, scopes = line.partition(" ")
            digest = digest.lower()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ConfigError(
                    f"API key entry {number} is not a SHA-256 hex digest; store hashes, not keys "
                    "(`online-rl keys new` prints both)"
                )
            names = frozenset(s.strip() for s in scopes.split(",") if s.strip()) or frozenset({_ALL})
            self._keys[digest] = KeyInfo(digest[:8], names)

    @classmethod
    def from_sources(cls, hashes: Iterable[str], file: Path | None) -> ApiKeyStore:
        entries = list(hashes)
        if file is not None:
            try:
                entries.extend(file.read_text().splitlines())
            except OSError as exc:
                raise ConfigError(f"cannot read the API key file {file}: {exc.strerror}") from exc
        return cls(entries)

    def __len__(self) -> int:
        return len(self._keys)

    def verify(self, raw: str | None) -> KeyInfo | None:
        """The key's info, or None when it is missing or unknown."""
        if not raw:
            return None
        # A lookup by digest: what is compared is a hash, so its timing tells nothing about the key.
        return self._keys.get(hash_key(raw))


class Unauthenticated(OnlineRLError):
    """No key, or a key that is not known (HTTP 401)."""


class Forbidden(OnlineRLError):
    """A known key without the scope the call needs (HTTP 403)."""


def authorize(keys: ApiKeyStore, authorization: str | None, scope: str) -> KeyInfo:
    """Check an `Authorization: Bearer <key>` header for `scope`. `admin` is never implied: a key
    made without scopes may call everything but the admin routes."""
    bearer = authorization and authorization.lower().startswith("bearer ")
    raw = authorization[7:].strip() if bearer and authorization else None
    key = keys.verify(raw)
    if key is None:
        raise Unauthenticated("missing or unknown API key; send `Authorization: Bearer <key>` with a key "
                              "made by `online-rl keys new` (the openai client sends its api_key this way)")
    allowed = scope in key.scopes if scope == "admin" else key.allows(scope)
    if not allowed:
        hint = "" if scope == "admin" else " (or no scopes)"
        raise Forbidden(f"this API key lacks the '{scope}' scope; use a key whose entry lists "
                        f"'{scope}'{hint}")
    return key
