"""API keys, stored only as SHA-256 hashes (in the config or a mounted Secret file).

An entry is `<sha256 hex>` (every scope) or `<sha256 hex> <scope>[,<scope>...]`, optionally followed
by `user=<id>`: a key bound to one user, which can speak only for that user (its chats are served as
that user, its feedback must name that user). A key without `user=` belongs to a trusted backend that
names its users itself. A raw key is shown once, when `online-rl keys new` makes it; only its hash is
ever stored.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from online_rl.errors import ConfigError
from online_rl.ingest.errors import Forbidden, Unauthenticated

__all__ = ["SCOPES", "ApiKeyStore", "KeyInfo", "authorize", "check_subject", "hash_key", "new_key"]

_ALL = "*"
_SUBJECT = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")  # the events' user id
SCOPES = ("feedback", "inference", "admin", "tester")  # what the services check


def hash_key(raw: str) -> str:
    """The stored form of a raw API key."""
    return hashlib.sha256(raw.encode()).hexdigest()


def new_key() -> tuple[str, str]:
    """A fresh raw key (shown to the user once) and its hash (to store)."""
    raw = "orl_" + secrets.token_urlsafe(32)
    return raw, hash_key(raw)


def check_subject(subject: str, where: str = "the user") -> str:
    """`subject` if it can be a key's user (an events' user id), else a `ConfigError` saying why."""
    if not _SUBJECT.match(subject):
        raise ConfigError(f"{where}: user={subject!r} is not a user id; use 1-128 letters, digits or "
                          "._:@/+=- (`online-rl keys new --user <id>` writes the entry)")
    return subject


@dataclass(frozen=True)
class KeyInfo:
    """Who a verified key is: a short id (hash prefix, safe to log), its scopes and, for a key bound to
    one user, that user's id (`subject`)."""

    key_id: str
    scopes: frozenset[str]
    subject: str | None = None

    def allows(self, scope: str) -> bool:
        return _ALL in self.scopes or scope in self.scopes

    def user_for(self, named: str | None) -> str | None:
        """The user a request speaks for: a bound key's own user (naming another is `Forbidden`),
        else the user the request names (None if it names none)."""
        if self.subject is None:
            return named
        if named is not None and named != self.subject:
            shown = named[:128] if isinstance(named, str) else type(named).__name__
            raise Forbidden(f"this API key is bound to user '{self.subject}' and may not speak for '{shown}'")
        return self.subject


class ApiKeyStore:
    """Verifies raw keys against stored hashes."""

    def __init__(self, entries: Iterable[str]) -> None:
        self._keys: dict[str, KeyInfo] = {}
        for number, entry in enumerate(entries, 1):
            line = entry.split("#", 1)[0].strip()
            if not line:
                continue
            digest, *rest = line.split()
            digest = digest.lower()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ConfigError(
                    f"API key entry {number} is not a SHA-256 hex digest; store hashes, not keys "
                    "(`online-rl keys new` prints both)"
                )
            # `user=<id>` may stand on its own or in the comma-separated list: a key meant for one user
            # must never come out bound to none
            tokens = [t.strip() for part in rest for t in part.split(",") if t.strip()]
            where = f"API key entry {number}"
            subjects = [check_subject(t[5:], where) for t in tokens if t.startswith("user=")]
            scopes = [t for t in tokens if not t.startswith("user=")]
            if len(subjects) > 1:
                raise ConfigError(f"API key entry {number}: give at most one user=<id>")
            odd = [t for t in scopes if t not in SCOPES]
            if odd:  # a typo would make a key that can do nothing, or a user id with a space a scope
                raise ConfigError(f"{where}: {odd[0]!r} is not a scope; the scopes are {', '.join(SCOPES)} "
                                  "(comma-separated; none = all but admin), and a user is given as user=<id>")
            names = frozenset(scopes) or frozenset({_ALL})
            self._keys[digest] = KeyInfo(digest[:8], names, subjects[0] if subjects else None)

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


def authorize(keys: ApiKeyStore, authorization: str | None, scope: str,
              api_key: str | None = None) -> KeyInfo:
    """Check an `Authorization: Bearer <key>` header (else `api_key`, an `X-API-Key` header where a
    service takes one) for `scope`. `admin` is never implied: a key made without scopes may call
    everything but the admin routes."""
    bearer = authorization and authorization.lower().startswith("bearer ")
    raw = authorization[7:].strip() if bearer and authorization else api_key
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
