"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) as a thin adapter:
its typed request (anthropic_request.py) becomes the one internal chat request, the engine's events
become Anthropic's message or its stream of named events, errors come back in Anthropic's shape."""

import json
import uuid

from fastapi import APIRouter
from fastapi import Request as HttpRequest
from fastapi.responses import StreamingResponse

from mlx_ring.api.anthropic_request import CountTokensRequest, MessagesRequest
from mlx_ring.api.bodies import Bodies
from mlx_ring.api.dialects import arguments, chat_request, collect, dialect_router, named_sse
from mlx_ring.api.errors import error_body
from mlx_ring.api.front import Front
from mlx_ring.api.keepalive import beating
from mlx_ring.api.openapi import body_of
from mlx_ring.api.served import context_cuts

# Anthropic's error types, by status code.
KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


ERROR_SCHEMA = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}


def error_shape(status: int, openai: dict) -> dict:
    return {
        "type": "error",
        "error": {"type": KINDS.get(status, "api_error"), "message": openai["error"]["message"]},
    }


def stop_reason(done, calls: list, window: bool) -> dict:
    """`stop_reason` and `stop_sequence`; `window`: the context left less room than max_tokens asked
    for, so an answer cut at the limit says the context ran out."""
    if done.finish_reason == "length":
        reason = "model_context_window_exceeded" if window else "max_tokens"
    else:
        reason = "tool_use" if calls else "stop_sequence" if done.stop_sequence else "end_turn"
    return {
        "stop_reason": reason,
        "stop_sequence": done.stop_sequence if reason == "stop_sequence" else None,
    }


def usage(done) -> dict:
    """Anthropic's usage: `input_tokens` the prompt's tokens after the last cache read,
    which `cache_read_input_tokens` counts (the prompt cache is automatic here: nothing
    is counted as written)."""
    return prompt_usage(done.prompt_tokens, done.cached_tokens) | {
        "output_tokens": done.completion_tokens
    }


def prompt_usage(prompt: int, cached: int) -> dict:
    return {
        "input_tokens": prompt - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def tool_use(call: dict) -> dict:
    return {
        "type": "tool_use",
        "id": call["id"].replace("call_", "toolu_", 1),
        "name": call["function"]["name"],
        "input": arguments(call),
    }


def anthropic_routes(front: Front, bodies: Bodies) -> APIRouter:
    router = dialect_router(error_shape, ERROR_SCHEMA)

    @router.post("/v1/messages", openapi_extra=body_of(MessagesRequest))
    async def messages(http: HttpRequest):
        body = await bodies.read(MessagesRequest, await http.body())
        fields = body.chat(
            max_tokens=body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            stop=body.stop_sequences or None,
            stream=body.stream,
        )
        chat = chat_request(fields, names={"stop": "stop_sequences"})
        used, events = await front.events(chat, http, stream_calls=body.stream, start=body.stream)
        window = context_cuts(front.served, used, body.max_tokens)
        head = {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": front.served.id,
        }
        if body.stream:
            return StreamingResponse(
                stream(head, used, events, window, front.keepalive_s),
                media_type="text/event-stream",
            )
        text, calls, done = await collect(events)
        content = (
            [{"type": "text", "text": text.strip() if calls else text}]
            if text.strip() or not calls
            else []
        ) + [tool_use(c) for c in calls]
        return (
            head | {"content": content} | stop_reason(done, calls, window) | {"usage": usage(done)}
        )

    @router.post("/v1/messages/count_tokens", openapi_extra=body_of(CountTokensRequest))
    async def count_tokens(http: HttpRequest):
        body = await bodies.read(CountTokensRequest, await http.body())
        prompt = await front.chat(chat_request(body.chat()))
        return {"input_tokens": len(prompt.ids)}

    return router


async def stream(head: dict, used: int, events, window: bool, keepalive_s: float):
    """Anthropic's event sequence: message_start, ping, each content block's start, deltas and
    stop, message_delta (stop_reason, usage), message_stop; a failure mid-way is an `error`
    event. As in Anthropic's API, message_start comes once the prompt is looked up in the prompt
    cache (its prefill begins), and its usage splits the prompt into `input_tokens` and
    `cache_read_input_tokens` as the final usage does; a prompt still waiting for its turn after
    `keepalive_s` seconds gets it then, the whole prompt counted as input (message_delta splits
    it). Until the first token, a ping every `keepalive_s` seconds keeps the stream alive."""
    ping = named_sse({"type": "ping"})

    def start(cached: int) -> str:
        usage = prompt_usage(used, cached) | {"output_tokens": 0}
        return (
            named_sse(
                {
                    "type": "message_start",
                    "message": head
                    | {"content": [], "stop_reason": None, "stop_sequence": None, "usage": usage},
                }
            )
            + ping
        )

    index, text_open, blank, calls, started = 0, False, "", [], False
    async for event in beating(events, keepalive_s, lambda e: e[0] == "start"):
        if event is None:
            yield ping if started else start(0)
            started = True
            continue
        kind, value = event
        if kind == "start":
            if not started:
                yield start(value)
                started = True
            continue
        if not started:  # a failure before the prompt was read
            yield start(0)
            started = True
        if kind == "text":
            if not text_open and not (blank + value).strip():
                blank += value  # whitespace before a tool call opens no block
                continue
            if not text_open:
                yield named_sse(
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    }
                )
                text_open, value, blank = True, blank + value, ""
            yield named_sse(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": value},
                }
            )
            continue
        if text_open:
            yield named_sse({"type": "content_block_stop", "index": index})
            index, text_open = index + 1, False
        if kind == "begin":  # a call's input as it is generated
            yield named_sse(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": tool_use(value) | {"input": {}},
                }
            )
        elif kind == "args":
            yield named_sse(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": value},
                }
            )
        elif kind == "end":
            calls.append(value)
            yield named_sse({"type": "content_block_stop", "index": index})
            index += 1
        elif kind == "call":  # a call parsed whole
            calls.append(value)
            block = tool_use(value)
            yield named_sse(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": block | {"input": {}},
                }
            )
            yield named_sse(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {
                        "type": "input_json_delta",
                        "partial_json": json.dumps(block["input"]),
                    },
                }
            )
            yield named_sse({"type": "content_block_stop", "index": index})
            index += 1
        elif kind == "failed":
            yield named_sse(error_shape(value.status, error_body(value.message, value.type)))
            return
        else:
            yield named_sse(
                {
                    "type": "message_delta",
                    "delta": stop_reason(value, calls, window),
                    "usage": usage(value),
                }
            )
            yield named_sse({"type": "message_stop"})
