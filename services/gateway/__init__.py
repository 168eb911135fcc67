"""The canary gateway: OpenAI-compatible front door that routes each request to the champion or the
challenger version and runs the rollout controller (see docs/rollout.md)."""
