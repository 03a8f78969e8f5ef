"""ASGI middleware in front of the routes: JSON bodies whatever their Content-Type, and the API key."""

import hmac

from fastapi.responses import JSONResponse

from mlx_ring.api.errors import error_body


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


class BearerAuth:
    """ASGI middleware: with an API key set, /v1/* needs `Authorization: Bearer <key>`; /health stays open."""

    def __init__(self, app, key: str):
        self.app, self.key = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.key):  # constant time: no timing oracle on the key
                body = error_body("missing or wrong API key; send Authorization: Bearer <key>", "authentication_error", code="invalid_api_key")
                return await JSONResponse(body, status_code=401)(scope, receive, send)
        await self.app(scope, receive, send)
