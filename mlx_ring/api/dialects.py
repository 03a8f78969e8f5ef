"""What the agents' dialects (Anthropic Messages, OpenAI Responses, Ollama) share: their
request turned into the one internal chat request, which the front (front.py) checks,
templates and queues exactly as chat completions (same sampling, template, grammar, tool-call
parsing and prompt cache), their answer collected from its events, and errors reshaped into
the dialect's own error body."""

import json
from typing import AsyncIterator, Callable

from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import ValidationError

from mlx_ring.api.errors import ApiError, error_body, validation_error, validation_message
from mlx_ring.api.openai_request import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDef,
    FunctionName,
    NamedTool,
    Tool,
    ToolCall,
)
from mlx_ring.api.schema import (
    JsonObjectFormat,
    JsonSchemaFormat,
    JsonSchemaSpec,
    TextFormat,
    _Sampling,
)
from mlx_ring.serving.port import Done

SAMPLED = set(_Sampling.model_fields)  # what every kind of internal request takes and bounds


def chat_request(fields: dict, kind: type = ChatCompletionRequest, names: dict | None = None):
    """The one internal request (`kind`: chat, or a completion) from a dialect's translated fields.
    Its sampling fields are checked here by the internal request's own rules, which hold each bound
    (a dialect's model copies none): a bad value is a 400 naming the client's field (`names`: the
    internal field -> the dialect's, where they differ). Messages, tools and formats are built as
    they are: the dialect's own model validated them, in its own words."""
    out = {k: v for k, v in fields.items() if v is not None}
    try:
        sampled = _Sampling.model_validate({k: out.pop(k) for k in list(out) if k in SAMPLED})
    except ValidationError as e:
        raise _named(e, names or {}) from None
    out |= {k: getattr(sampled, k) for k in sampled.model_fields_set}
    if "messages" in out:
        out["messages"] = [
            ChatMessage.model_construct(
                **m
                | (
                    {
                        "tool_calls": [
                            ToolCall.model_construct(
                                id=c["id"],
                                type="function",
                                function=FunctionCall.model_construct(**c["function"]),
                            )
                            for c in m["tool_calls"]
                        ]
                    }
                    if m.get("tool_calls")
                    else {}
                )
            )
            for m in out["messages"]
        ]
    if "tools" in out:
        out["tools"] = [
            Tool.model_construct(
                type="function", function=FunctionDef.model_construct(**t["function"])
            )
            for t in out["tools"]
        ]
    if isinstance(out.get("tool_choice"), dict):
        out["tool_choice"] = NamedTool.model_construct(
            type="function",
            function=FunctionName.model_construct(name=out["tool_choice"]["function"]["name"]),
        )
    if "response_format" in out:
        out["response_format"] = _response_format(out["response_format"])
    return kind.model_construct(**out)


def _named(e: ValidationError, names: dict[str, str]) -> ApiError:
    """The 400 for the first problem of the internal request's sampling fields,
    in the client's words."""
    errors = e.errors(include_url=False, include_context=False, include_input=False)
    first = validation_message(errors[:1])
    ours, message = first["param"], first["message"]
    theirs = names.get(ours, ours)
    if ours and message.startswith(ours):
        message = theirs + message[len(ours) :]
    return ApiError(400, message, param=theirs.split(".")[0] if theirs else None)


def _response_format(fmt: dict):
    if fmt["type"] != "json_schema":
        return {"text": TextFormat, "json_object": JsonObjectFormat}[fmt["type"]].model_construct(
            type=fmt["type"]
        )
    spec = fmt["json_schema"]
    return JsonSchemaFormat.model_construct(
        type="json_schema",
        json_schema=JsonSchemaSpec.model_construct(
            name=spec["name"], schema_=spec.get("schema"), strict=spec.get("strict")
        ),
    )


def check_tool_choice(
    choice, names: list[str], named: str | None, forced: bool, json_field: str | None
) -> None:
    """The internal request's rules for a tool choice, for a dialect's model to raise in its own
    words: a choice needs tools (`names`), a `named` one must be one of them, and a `forced` call
    excludes a JSON answer (`json_field`: the dialect's field that asks for one, else None)."""
    if choice is None:
        return
    if not names:
        raise ValueError("tool_choice: only allowed when tools are given")
    if named is not None and named not in names:
        raise ValueError(f"tool_choice: names {named!r}, which is not one of the tools")
    if forced and json_field:
        raise ValueError(
            f"{json_field}: a JSON answer and a required tool call exclude each other; drop one"
        )


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
        return Response(
            json.dumps(shape(status, body)), status, headers, media_type="application/json"
        )

    class Reshaped(APIRoute):
        def get_route_handler(self):
            handler = super().get_route_handler()

            async def reshaped(request):
                try:
                    return await handler(request)
                except RequestValidationError as e:
                    return answer(400, json.loads(validation_error(e).body))
                except ApiError as e:
                    return answer(
                        e.status, error_body(e.message, e.type, e.param, e.code), e.headers
                    )

            return reshaped

    return Reshaped


def dialect_router(shape: Callable[[int, dict], dict], schema: dict) -> APIRouter:
    """A router for a dialect's routes: errors answer in its shape (`error_routes`) and are
    documented as `schema` in /openapi.json, which schemathesis holds each route to
    (tests/unit/api/test_schema.py)."""
    doc = {"content": {"application/json": {"schema": schema}}}
    return APIRouter(
        route_class=error_routes(shape),
        responses={
            400: {"description": "Bad request"} | doc,
            404: {"description": "Unknown model"} | doc,
            503: {"description": "Busy, draining or the ring is down"} | doc,
        },
    )


def named_sse(event: dict) -> str:
    """A server-sent event named for its `type`, as Anthropic's and the Responses
    API's streams send them."""
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
