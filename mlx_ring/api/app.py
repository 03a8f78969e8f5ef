"""The HTTP app on rank 0 (FastAPI), built around the engine's port: it never touches MLX, so tests
build it in process around a stand-in engine."""

import asyncio
import json

from fastapi import FastAPI

from mlx_ring.api.anthropic import anthropic_routes
from mlx_ring.api.bodies import Bodies
from mlx_ring.api.errors import answer_errors_as_openai
from mlx_ring.api.front import Front
from mlx_ring.api.keepalive import KEEPALIVE_S
from mlx_ring.api.keys import Key
from mlx_ring.api.metrics import CountRequests, RingMetrics
from mlx_ring.api.middleware import MAX_BODY_BYTES, BodyLimit, JsonBodies, KeyAuth
from mlx_ring.api.ollama_routes import ollama_routes
from mlx_ring.api.openai_chat import openai_routes
from mlx_ring.api.openai_responses import responses_routes
from mlx_ring.api.openapi import document
from mlx_ring.api.responses_kept import Kept
from mlx_ring.api.ring_routes import status_routes
from mlx_ring.api.served import ServedModel
from mlx_ring.serving.port import EnginePort


def make_app(
    engine: EnginePort,
    served: ServedModel,
    keys: list[Key] = (),
    restarts: int = 0,
    max_body_bytes: int = MAX_BODY_BYTES,
    away: dict | None = None,
    keepalive_s: float = KEEPALIVE_S,
) -> FastAPI:
    """The OpenAI API, the other dialects and the ring's status routes; `keys`: the API keys
    /v1/* and /api/* need (none: open); `away`: the hosts a failed-over ring serves without
    (RING_AWAY), else None; `keepalive_s`: seconds between a stream's keep-alives while its
    prompt prefills."""
    bodies = Bodies()
    app = FastAPI(
        title="mlx-ring",
        description="One model split across a ring of MLX ranks, served as OpenAI.",
        on_shutdown=[bodies.close],
    )
    metrics = RingMetrics(served.cluster.hosts(), restarts, away)
    # every dialect's one way into serving; each adapter below reads its steps
    front = Front(engine, served, metrics, keepalive_s)
    routers = [
        openai_routes(front, bodies),
        anthropic_routes(front, bodies),
        responses_routes(front, bodies, Kept()),
        ollama_routes(front, bodies),
        status_routes(engine, served, metrics, away),
    ]
    for router in routers:
        app.include_router(router)
    answer_errors_as_openai(app)
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    if keys:
        app.add_middleware(KeyAuth, keys=list(keys))
    routes = [*app.routes, *(route for router in routers for route in router.routes)]
    # added last, so outermost: it sees 401s too
    app.add_middleware(CountRequests, metrics=metrics, routes=routes)
    app.openapi = lambda: document(app, served)
    return app


def warm_http(app: FastAPI) -> tuple[int, dict]:
    """Send `app` one chat request that is read, validated, templated, tokenized and refused (its
    max_tokens is over every limit), through the ASGI interface without a socket: the first such
    request otherwise waits for what Python builds on first use (34-37 ms on a 2-core CPU). Give it
    a twin of the served app, built without keys, so the served one counts nothing. Returns the
    status and the body."""
    body = json.dumps(
        {
            "model": "default",
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 2**62,
        }
    ).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
    }
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, json.loads(
        b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    )
