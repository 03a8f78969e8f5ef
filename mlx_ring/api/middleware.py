"""ASGI middleware in front of the routes: a limit on body size, JSON bodies whatever their
Content-Type, and API keys."""

from fastapi.responses import JSONResponse

from mlx_ring.api.errors import error_body
from mlx_ring.api.keys import Key, RateLimited, count_request, find

MAX_BODY_BYTES = 16 * 1024 * 1024  # the default of MAX_BODY_BYTES


class BodyLimit:
    """ASGI middleware: a body over `limit` bytes is refused with a 413 in OpenAI's shape, as
    soon as its Content-Length or its chunks so far say so, before anything parses it."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    def _refuse(self, scope, receive, send):
        text = (
            f"the request body is over this server's limit of {self.limit} bytes (MAX_BODY_BYTES); "
            "send a shorter prompt or fewer messages"
        )
        return JSONResponse(
            error_body(text, "invalid_request_error", code="request_too_large"), status_code=413
        )(scope, receive, send)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            return await self._refuse(scope, receive, send)
        # Without a Content-Length (chunked): read the body here, counting, and hand it on whole.
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, _replay([], message, receive), send)  # the client left
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._refuse(scope, receive, send)
            more = message.get("more_body", False)
        await self.app(scope, _replay(chunks, None, receive), send)


def _replay(chunks: list[bytes], last: dict | None, receive):
    """An ASGI receive that gives the body read already (or the message that ended it),
    then the real one's."""
    pending = (
        [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
        if last is None
        else [last]
    )

    async def replay():
        return pending.pop() if pending else await receive()

    return replay


class JsonBodies:
    """ASGI middleware: read POST bodies as JSON whatever Content-Type says, as OpenAI's API and
    `curl -d` users expect (curl sends form-urlencoded by default)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = dict(scope, headers=headers + [(b"content-type", b"application/json")])
        await self.app(scope, receive, send)


class KeyAuth:
    """ASGI middleware: with keys set, /v1/* and /api/* need `Authorization: Bearer <key>` or
    `x-api-key: <key>` (401), within the key's requests per minute (429 with Retry-After);
    /health and /metrics stay open. The key found rides in the request's state, for its token
    limit; only its name is ever shown."""

    def __init__(self, app, keys: list[Key]):
        self.app, self.keys = app, keys

    async def __call__(self, scope, receive, send):
        # /api/: Ollama's routes
        if scope["type"] == "http" and scope["path"].startswith(("/v1/", "/api/")):
            headers = dict(scope["headers"])
            # Anthropic's clients send the key as `x-api-key`: the same keys, the same limits.
            key = find(
                self.keys,
                headers.get(b"authorization")
                or (b"Bearer " + headers[b"x-api-key"] if b"x-api-key" in headers else b""),
            )
            if key is None:
                body = error_body(
                    "missing or wrong API key; send Authorization: Bearer <key>",
                    "authentication_error",
                    code="invalid_api_key",
                )
                return await JSONResponse(body, status_code=401)(scope, receive, send)
            try:
                count_request(key)
            except RateLimited as e:
                return await JSONResponse(
                    error_body(str(e), e.kind, code="rate_limit_exceeded"),
                    status_code=429,
                    headers={"Retry-After": str(e.retry_after)},
                )(scope, receive, send)
            scope.setdefault("state", {})["key"] = key
        await self.app(scope, receive, send)
