"""What the agents' dialects (Anthropic Messages, OpenAI Responses, Ollama) share: their request turned
into the one internal chat request, which the front (front.py) checks, templates and queues exactly as
chat completions (same sampling, template, grammar, tool-call parsing and prompt cache), their answer
collected from its events, and errors reshaped into the dialect's own error body."""

import json
from typing import AsyncIterator, Callable

from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import ValidationError

from mlx_ring.api.errors import ApiError, error_body, validation_error
from mlx_ring.api.schema import ChatCompletionRequest
from mlx_ring.serving.port import Done


def chat_request(fields: dict, where: dict | None = None, kind=ChatCompletionRequest):
    """The internal request (`kind`: chat, or a completion) from a dialect's translated fields; a 400 when they
    break one of its rules (`where`: internal field name -> the dialect's name for it, so the message names the client's field)."""
    try:
        return kind.model_validate(fields)
    except ValidationError as e:
        first = e.errors()[0]
        loc = [str(p) for p in first["loc"]]
        if loc and where and loc[0] in where:
            loc[0] = where[loc[0]]
        msg = first["msg"].removeprefix("Value error, ")
        named = msg.split(": ", 1)[0]
        if not loc and where and named in where:  # a rule of the whole request names its field first
            msg = where[named] + msg[len(named):]
        param = loc[0] if loc else (where or {}).get(named)
        raise ApiError(400, f"{'.'.join(loc)}: {msg}" if loc else msg, param=param) from None


async def collect(events: AsyncIterator[tuple]) -> tuple[str, list[dict], Done]:
    """A whole answer: (text, tool calls, Done); a Failed event raises its ApiError."""
    text, calls = [], []
    async for kind, value in events:
        if kind == "failed":
            raise ApiError(value.status, value.message, value.type)
        if kind == "text":
            text.append(value)
        elif kind in ("call", "end"):
            calls.append(value)
        elif kind == "done":
            return "".join(text), calls, value
    raise AssertionError("an answer's events end with done or failed")


def arguments(call: dict) -> dict:
    """A parsed tool call's arguments as an object (the parser hands them over as JSON text)."""
    try:
        args = json.loads(call["function"]["arguments"])
    except json.JSONDecodeError:
        return {}
    return args if isinstance(args, dict) else {}


def error_routes(shape: Callable[[int, dict], dict]) -> type[APIRoute]:
    """A route class whose errors (bad bodies, refusals) answer in a dialect's own shape:
    `shape(status, the OpenAI error body)` -> the dialect's body."""

    def answer(status: int, body: dict, headers=None) -> Response:
        # ASCII JSON: a message that quotes a lone surrogate from the request still encodes
        return Response(json.dumps(shape(status, body)), status, headers, media_type="application/json")

    class Reshaped(APIRoute):
        def get_route_handler(self):
            handler = super().get_route_handler()

            async def reshaped(request):
                try:
                    return await handler(request)
                except RequestValidationError as e:
                    return answer(400, json.loads(validation_error(e).body))
                except ApiError as e:
                    return answer(e.status, error_body(e.message, e.type, e.param, e.code), e.headers)

            return reshaped

    return Reshaped


def dialect_router(shape: Callable[[int, dict], dict], schema: dict) -> APIRouter:
    """A router for a dialect's routes: errors answer in its shape (`error_routes`) and are documented
    as `schema` in /openapi.json, which schemathesis holds each route to (tests/unit/test_api_schema.py)."""
    doc = {"content": {"application/json": {"schema": schema}}}
    return APIRouter(route_class=error_routes(shape), include_in_schema=False, responses={
        400: {"description": "Bad request"} | doc, 404: {"description": "Unknown model"} | doc,
        503: {"description": "Busy, draining or the ring is down"} | doc})


def named_sse(event: dict) -> str:
    """A server-sent event named for its `type`, as Anthropic's and the Responses API's streams send them."""
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
