"""The gateway's routes: the OpenAI pass-through, the rollout control API, its page, operations."""
