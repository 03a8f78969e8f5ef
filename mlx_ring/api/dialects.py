"""What every other dialect (Anthropic Messages, OpenAI Responses, Ollama) shares: its request turned
into the one internal chat request, that request checked, templated and queued exactly as chat
completions are (same sampling, template, grammar, tool-call parsing and prompt cache), its answer as
a flow of plain events, and errors reshaped into the dialect's own error body."""

import json
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import ValidationError

from mlx_ring.api.answers import Answers, Choice
from mlx_ring.api.chat import tool_calls
from mlx_ring.api.errors import ApiError, error_body, validation_error
from mlx_ring.api.prompts import Prompts
from mlx_ring.api.schema import ChatCompletionRequest, CompletionRequest
from mlx_ring.api.served import ServedModel, check_model, check_sampling
from mlx_ring.api.toolcalls import ToolCallText
from mlx_ring.serving.port import Delta, Done, Failed

# The dialects' routes are kept out of /openapi.json for now: it documents OpenAI's error shape for
# every route, and schemathesis (tests/unit/test_api_schema.py) holds each route to it.
OPENAPI = False


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


@dataclass
class Engine:
    """The parts of the app a dialect's routes need."""

    served: ServedModel
    prompts: Prompts
    answers: Answers

    async def prompt(self, body: ChatCompletionRequest) -> tuple[list[int], str | None, dict | None]:
        """(prompt ids, grammar, tool-call parsing) for a checked request, as chat completions makes them."""
        check_model(self.served, body.model)
        check_sampling(self.served, body)
        tools = tool_calls(self.served, body)
        prompt, grammar = await self.prompts.chat(body)
        return prompt, grammar, tools

    async def events(self, body: ChatCompletionRequest, http: HttpRequest, stream_calls: bool = False,
                     start: bool = False) -> tuple[int, AsyncIterator[tuple]]:
        """(prompt tokens, the answer's events): ("text", str), ("call", OpenAI tool call dict),
        ("done", Done) or ("failed", Failed). `stream_calls`: a call whose format allows it comes as
        ("begin", the call with arguments ""), ("args", a fragment)..., ("end", the whole call) instead
        of one "call". `start`: first ("start", the prompt's tokens the prompt cache held), once known
        (when the first text or the end comes). Errors before anything is queued are raised here. max_tokens over the room the
        prompt leaves is cut to it, as agents expect (docs/api.md)."""
        body.clamp_tokens()
        prompt, grammar, tools = await self.prompt(body)
        flow = self.answers.start(body, prompt, http, grammar)
        return len(prompt), _events(flow, Choice(0, ToolCallText(**tools, stream=stream_calls) if tools else None), start)

    async def raw_events(self, body: CompletionRequest, http: HttpRequest) -> tuple[int, AsyncIterator[tuple]]:
        """As `events`, for a prompt sent as it is: tokenized, no chat template."""
        body.clamp_tokens()
        check_model(self.served, body.model)
        check_sampling(self.served, body)
        prompt = await self.prompts.completion(body)
        return len(prompt), _events(self.answers.start(body, prompt, http), Choice(0, None))


async def _events(flow, choice: Choice, start: bool = False):
    async for _, ev in flow:
        if start and isinstance(ev, (Delta, Done)):
            start = False
            yield "start", ev.cached_tokens
        if isinstance(ev, Failed):
            yield "failed", ev
            return
        if isinstance(ev, Done):
            choice.done = ev
        for kind, _, value in choice.add(ev.text if isinstance(ev, Delta) else "", final=isinstance(ev, Done)):
            yield kind, value
        if isinstance(ev, Done):
            yield "done", ev


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


def named_sse(event: dict) -> str:
    """A server-sent event named for its `type`, as Anthropic's and the Responses API's streams send them."""
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
