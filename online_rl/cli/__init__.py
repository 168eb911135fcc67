"""The `online-rl` command line."""

from online_rl.cli.app import app, main

__all__ = ["app", "main"]
