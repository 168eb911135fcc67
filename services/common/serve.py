"""Starting a service: the one way `online-rl serve <name>` and `python -m services.<name>` build an
app and serve it, and the start-up check every app makes.

`serve(create_app, section)` builds the app from the settings, announces its health URL (where the
container image asks, `$ORL_HEALTH_FILE`) and serves it under uvicorn with the section's caps.
`serve_named` is the command line's only door into the apps (the library imports no FastAPI app).
`require_api_keys` is called by each `create_app`, never on the settings as a whole: `online-rl
config` and the components that do not serve must not fail because a service lists no key.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Literal, cast, get_args

from fastapi import FastAPI

from online_rl.config import FeedbackApiConfig, GatewayConfig, InferenceConfig, Settings, load_settings
from online_rl.errors import ConfigError
from online_rl.ingest import ApiKeyStore
from online_rl.logs import LogFormat, configure_logging

__all__ = ["AppFactory", "Section", "ServiceName", "require_api_keys", "serve", "serve_named"]

AppFactory = Callable[[Settings], FastAPI]
Section = Literal["feedback_api", "inference", "gateway"]
ServiceName = Literal["feedback", "inference", "gateway"]

_REFUSED = {"feedback_api": "write", "inference": "request", "gateway": "request"}  # what no key refuses


def _section(settings: Settings, section: Section) -> FeedbackApiConfig | InferenceConfig | GatewayConfig:
    api: FeedbackApiConfig | InferenceConfig | GatewayConfig = getattr(settings, section)
    return api


def require_api_keys(settings: Settings, section: Section) -> None:
    """Refuse to build an app whose `section` lists no API key (every call would be refused)."""
    api = _section(settings, section)
    if len(ApiKeyStore.from_sources(api.api_keys, api.api_keys_file)) == 0:
        raise ConfigError(
            f"{section}.api_keys is empty, so every {_REFUSED[section]} would be refused; create a key with "
            f"`online-rl keys new` and set its hash in {section}.api_keys (or api_keys_file)"
        )


def serve(create_app: AppFactory, section: Section, settings: Settings | None = None,
          host: str | None = None, port: int | None = None) -> None:
    """Build the app from `settings` and serve it on `host`:`port` (default: the section's) until
    stopped. Without `settings` (`python -m services.<name>`) this is the process's start: logging is
    set up as `online-rl` sets it up (INFO, `$ORL_LOG_FORMAT`) and the settings come from `$ORL_CONFIG`."""
    if settings is None:
        configure_logging(logging.INFO, _log_format())
        settings = load_settings()
    api = _section(settings, section)
    host, port = host or api.host, port or api.port
    app = create_app(settings)
    from online_rl.cli.health import announce_health

    announce_health(f"http://127.0.0.1:{port}/healthz")
    _run(app, host, port, api.max_concurrency)


def serve_named(name: ServiceName, settings: Settings, host: str | None = None,
                port: int | None = None) -> None:
    """`online-rl serve <name>`: that service's app, served as `serve` does."""
    if name == "feedback":
        from services.feedback.main import create_app as feedback_app

        serve(feedback_app, "feedback_api", settings, host, port)
    elif name == "inference":
        from services.inference.main import create_app as inference_app

        serve(inference_app, "inference", settings, host, port)
    else:
        from services.gateway.main import create_app as gateway_app

        serve(gateway_app, "gateway", settings, host, port)


def _log_format() -> LogFormat:
    value = os.environ.get("ORL_LOG_FORMAT", "text")
    if value not in get_args(LogFormat):
        raise ConfigError(f"ORL_LOG_FORMAT={value!r}: use one of {', '.join(get_args(LogFormat))}")
    return cast(LogFormat, value)


def _run(app: FastAPI, host: str, port: int, max_concurrency: int) -> None:
    """Serve `app` until stopped: at most `max_concurrency` connections and tasks at once (uvicorn
    answers 503 past it), idle keep-alive connections closed after 5 s, so idle or slow clients cannot
    hold every worker."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False,
                limit_concurrency=max_concurrency, timeout_keep_alive=5)
