"""API key entries (pure): scopes, and the user a key may be bound to in either spelling."""

from __future__ import annotations

import pytest

from online_rl.errors import ConfigError
from online_rl.ingest import ApiKeyStore, Forbidden, Unauthenticated, authorize, new_key


@pytest.mark.parametrize("tail", ["inference,feedback user=alice", "inference,feedback,user=alice",
                                  "user=alice inference,feedback", "inference, feedback, user=alice"])
def test_a_key_meant_for_one_user_is_bound_to_it_however_the_entry_is_written(tail: str) -> None:
    raw, digest = new_key()
    info = ApiKeyStore([f"{digest} {tail}"]).verify(raw)
    assert info is not None and info.subject == "alice" and info.scopes == {"inference", "feedback"}
    assert info.user_for(None) == info.user_for("alice") == "alice"
    with pytest.raises(Forbidden, match=r"bound to user 'alice'.*'bob'"):
        info.user_for("bob")


@pytest.mark.parametrize(("tail", "message"), [
    ("inference user=alice user=bob", "at most one user"),
    ("inference,user=has space", "'space' is not a scope"),
    ("inference,feedbak", "'feedbak' is not a scope; the scopes are feedback, inference"),
    ("inference,usr=alice", "'usr=alice' is not a scope"),
    ("user=", "not a user id"),
])
def test_a_malformed_entry_is_refused_with_the_reason(tail: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ApiKeyStore([f"{new_key()[1]} {tail}"])


def test_an_unbound_key_speaks_for_whoever_its_backend_names() -> None:
    raw, digest = new_key()
    info = ApiKeyStore([digest]).verify(raw)
    assert info is not None and info.subject is None and info.user_for("bob") == "bob"
    assert info.user_for(None) is None and info.allows("feedback") and info.allows("tester")


def test_a_service_that_takes_x_api_key_reads_it_only_without_a_bearer_token() -> None:
    raw, digest = new_key()
    keys = ApiKeyStore([f"{digest} feedback"])
    bearer = authorize(keys, f"Bearer {raw}", "feedback")
    assert authorize(keys, None, "feedback", api_key=raw).key_id == bearer.key_id
    assert authorize(keys, "Basic xyz", "feedback", api_key=raw).scopes == {"feedback"}
    with pytest.raises(Unauthenticated):
        authorize(keys, "Bearer wrong", "feedback", api_key=raw)  # the bearer token decides
    with pytest.raises(Unauthenticated):
        authorize(keys, None, "feedback")  # a service that takes no X-API-Key passes none
    with pytest.raises(Forbidden, match="lacks the 'inference' scope"):
        authorize(keys, None, "inference", api_key=raw)
