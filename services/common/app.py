"""Building an app with the edge every service has.

`edge_app` makes the FastAPI app and puts the app's service object in `state.service`, where the
shared pieces find it (its `keys` and `buckets` for `auth`, its `metrics.registry` for `health`, its
metrics and settings for an app's error table); then the app's error table, its routers and the body
limit. `app_service` is the dependency that hands routes that object. Knows nothing of what any app
serves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import APIRouter, FastAPI, Request

from online_rl import __version__
from services.common.limits import BodyLimit, openai_too_large

__all__ = ["app_service", "edge_app"]


async def app_service(request: Request) -> Any:
    """The app's service object; each app names its class: `Annotated[MyService, Depends(app_service)]`."""
    return request.app.state.service


def edge_app(title: str, description: str, lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]],
             service: object, install_errors: Callable[[FastAPI], None], routers: Iterable[APIRouter],
             max_body_bytes: int, too_large: Callable[[int], dict[str, Any]] = openai_too_large) -> FastAPI:
    """The app titled `title` (`description` opens its OpenAPI page) over `service`; a body over
    `max_body_bytes` is refused with 413 and the body `too_large(limit)`."""
    app = FastAPI(title=title, version=__version__, description=description, lifespan=lifespan)
    app.state.service = service
    install_errors(app)
    for router in routers:
        app.include_router(router)
    app.add_middleware(BodyLimit, limit=max_body_bytes, refusal=too_large)
    return app
