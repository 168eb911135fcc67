"""A stand-in inference replica for measuring the gateway's own relay cost (bench/scale.py): it answers
every chat at once with the same one-token OpenAI answer, so the proxies, not generation, bound the
rate. Not a model and not for tests of behaviour.

    python bench/upstream_stub.py PORT
"""

from __future__ import annotations

import json
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

ANSWER = json.dumps({
    "id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": "stub", "request_id": "stub",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}).encode()


async def chat(request: Request) -> Response:
    await request.body()
    return Response(ANSWER, media_type="application/json")


async def adapters(request: Request) -> Response:
    return Response(b'{"adapters": []}', media_type="application/json")


app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                        Route("/admin/adapters", adapters, methods=["GET"])])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
