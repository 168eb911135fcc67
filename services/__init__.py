"""Thin FastAPI apps over the `online_rl` library: inference, feedback, gateway."""
