"""The OpenAI-compatible inference service over online_rl.serving."""
