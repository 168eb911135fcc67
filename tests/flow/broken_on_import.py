"""A module whose import raises, for the loading test."""

raise RuntimeError("broken on purpose")
