"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) as a thin adapter:
its typed request becomes the one internal chat request, the engine's events become Anthropic's
message or its stream of named events, errors come back in Anthropic's shape."""

import json
import uuid
from typing import Annotated, ClassVar, Literal

from fastapi import APIRouter
from fastapi import Request as HttpRequest
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

from mlx_ring.api.bodies import Bodies
from mlx_ring.api.dialects import (
    arguments,
    chat_request,
    check_tool_choice,
    collect,
    dialect_router,
    named_sse,
)
from mlx_ring.api.errors import error_body
from mlx_ring.api.front import Front
from mlx_ring.api.openapi import body_of
from mlx_ring.api.schema import NAME, Refused, _Strict, bounds_of, hosted_tools_refused
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


class _Block(_Strict):
    cache_control: dict | None = Field(
        None, description="Accepted and ignored: the prompt cache finds shared prefixes itself."
    )


class TextBlock(_Block):
    type: Literal["text"]
    text: str
    citations: list | None = None


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict


class MediaBlock(Refused):
    """Images and documents: recognised only to be refused, with a message that says where and
    why."""

    type: Literal["image", "document"]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[TextBlock | MediaBlock, Field(discriminator="type")]] | None = (
        None
    )
    is_error: bool | None = None

    def text(self) -> str:
        text = (
            self.content
            if isinstance(self.content, str)
            else "".join(b.text for b in self.content or [])
        )
        return f"Error: {text}" if self.is_error else text


class OtherBlock(BaseModel):
    """Blocks dropped: earlier thinking, which this server does not do."""

    model_config = ConfigDict(extra="allow")
    type: Literal["thinking", "redacted_thinking"]


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | MediaBlock | OtherBlock,
    Field(discriminator="type"),
]


def media_block(messages: list["Message"]) -> str | None:
    """Where the first image or document block is (`messages.4.content.0.content.1`), else None."""
    for i, m in enumerate(messages):
        for j, b in enumerate(m.content if isinstance(m.content, list) else []):
            inner = b.content if b.type == "tool_result" and isinstance(b.content, list) else []
            found = [(f"messages.{i}.content.{j}", b)] + [
                (f"messages.{i}.content.{j}.content.{k}", c) for k, c in enumerate(inner)
            ]
            for where, block in found:
                if isinstance(block, MediaBlock):
                    return (
                        f"{where}: {block.type} blocks are not supported by this text "
                        "model; send text blocks"
                    )
    return None


def _blocks_but(*kinds: str) -> dict:
    """JSON Schema: text, or blocks none of whose type is one of `kinds`."""
    return {
        "properties": {
            "content": {
                "anyOf": [
                    {"type": "string"},
                    {
                        "type": "array",
                        "items": {
                            "not": {
                                "required": ["type"],
                                "properties": {"type": {"enum": list(kinds)}},
                            }
                        },
                    },
                ]
            }
        }
    }


class Message(_Strict):
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {"if": {"properties": {"role": {"const": role}}}, "then": _blocks_but(*kinds)}
                for role, kinds in (
                    ("user", ["tool_use"]),
                    ("assistant", ["tool_result"]),
                    (
                        "system",
                        [
                            "tool_use",
                            "tool_result",
                            "thinking",
                            "redacted_thinking",
                            "image",
                            "document",
                        ],
                    ),
                )
            ]
        }
    )
    # "system": an instruction within the conversation, as Claude Code sends them
    # (mid-conversation-system beta)
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]

    @model_validator(mode="after")
    def _check(self):
        for b in self.content if isinstance(self.content, list) else []:
            if self.role == "system" and b.type != "text":
                raise ValueError("system messages hold text blocks only")
            if b.type == "tool_use" and self.role != "assistant":
                raise ValueError("tool_use blocks belong in assistant messages")
            if b.type == "tool_result" and self.role != "user":
                raise ValueError("tool_result blocks belong in user messages")
        return self


class ToolDef(_Strict):
    type: Literal["custom"] | None = None
    name: str = Field(pattern=NAME)
    description: str | None = None
    input_schema: dict = Field(description="A JSON Schema of the tool's input object.")
    cache_control: dict | None = None


class _Choice(_Strict):
    disable_parallel_tool_use: bool | None = None


class AutoChoice(_Choice):
    type: Literal["auto"]


class AnyChoice(_Choice):
    type: Literal["any"]


class ToolChoiceNamed(_Choice):
    type: Literal["tool"]
    name: str


class NoneChoice(_Strict):
    type: Literal["none"]


ToolChoice = Annotated[
    AutoChoice | AnyChoice | ToolChoiceNamed | NoneChoice, Field(discriminator="type")
]


class Metadata(_Strict):
    user_id: str | None = None


class CacheControl(_Strict):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class ThinkingDisabled(_Strict):
    type: Literal["disabled"]


class ThinkingEnabled(_Strict):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1024)
    display: Literal["summarized", "omitted"] | None = None


class ThinkingAdaptive(_Strict):
    type: Literal["adaptive"]
    display: Literal["summarized", "omitted"] | None = None


Thinking = Annotated[
    ThinkingDisabled | ThinkingEnabled | ThinkingAdaptive, Field(discriminator="type")
]


class JsonOutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict = Field(
        alias="schema", description="A JSON Schema; the answer is decoded to match it."
    )


class OutputConfig(_Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = Field(
        None, description="Accepted and ignored."
    )
    format: JsonOutputFormat | None = None


class CountTokensRequest(_Strict):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolDef] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None
    # Accepted: this model answers without a thinking phase, so enabled or adaptive thinking gives a
    # message with no thinking blocks (Claude Code asks for thinking by default).
    thinking: Thinking | None = None
    cache_control: CacheControl | None = Field(
        None, description="Accepted and ignored: the prompt cache finds shared prefixes itself."
    )
    output_config: OutputConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _client_tools(cls, data):
        return hosted_tools_refused(
            data, ("custom",), "client tools (name, description, input_schema)"
        )

    @model_validator(mode="after")
    def _text_only(self):
        refusal = media_block(self.messages)
        if refusal:
            raise ValueError(refusal)
        return self

    @model_validator(mode="after")
    def _tool_choice(self):
        c = self.tool_choice
        check_tool_choice(
            c,
            [t.name for t in self.tools or []],
            getattr(c, "name", None),
            c is not None and c.type in ("any", "tool"),
            "output_config.format" if self.output_config and self.output_config.format else None,
        )
        return self

    def system_text(self) -> str:
        return (
            self.system
            if isinstance(self.system, str)
            else "".join(b.text for b in self.system or [])
        )

    def chat(self, **more) -> dict:
        """The internal chat request's fields."""
        fields = {
            "model": self.model,
            "messages": chat_messages(self.system_text(), self.messages),
        } | more
        if self.tools:
            fields["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.input_schema,
                    },
                }
                for t in self.tools
            ]
        c = self.tool_choice
        if c is not None:
            fields["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(
                c.type
            ) or {"type": "function", "function": {"name": c.name}}
            if getattr(c, "disable_parallel_tool_use", None):
                fields["parallel_tool_calls"] = False
        fmt = self.output_config and self.output_config.format
        if fmt:
            fields["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output_config", "schema": fmt.schema_},
            }
        return fields


class MessagesRequest(CountTokensRequest):
    unsupported: ClassVar[dict[str, str]] = {
        "container": "it runs no code execution",
        "mcp_servers": "it connects to no MCP servers; send their tools as tools",
        "context_management": "it does not edit the conversation; send it as it should be read",
    }
    # Clearing thinking blocks asks nothing of a model that writes none (Claude Code sends it by
    # default).
    harmless: ClassVar[dict[str, object]] = {
        "context_management": lambda v: (
            isinstance(v, dict)
            and set(v) <= {"edits"}
            and (v.get("edits") is None or isinstance(v["edits"], list))
            and all(
                isinstance(e, dict) and str(e.get("type", "")).startswith("clear_thinking_")
                for e in v.get("edits") or []
            )
        )
    }
    # checked where the internal request is built (dialects.chat_request), by its bounds
    max_tokens: int = Field(json_schema_extra=bounds_of("max_tokens"))
    stop_sequences: list[str] | None = Field(None, json_schema_extra=bounds_of("stop"))
    stream: bool = False
    temperature: float = Field(1.0, ge=0.0, le=1.0)  # Anthropic's own range, inside ours
    top_p: float = Field(1.0, json_schema_extra=bounds_of("top_p"))
    top_k: int = Field(0, description="0: off.", json_schema_extra=bounds_of("top_k"))
    metadata: Metadata | None = Field(None, description="Accepted and ignored.")
    service_tier: str | None = Field(None, description="Accepted and ignored.")
    context_management: Annotated[
        dict | None,
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "null"},
                    {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "edits": {
                                "anyOf": [
                                    {"type": "null"},
                                    {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": ["type"],
                                            "properties": {
                                                "type": {
                                                    "type": "string",
                                                    "pattern": "^clear_thinking_",
                                                }
                                            },
                                        },
                                    },
                                ]
                            }
                        },
                    },
                ]
            }
        ),
    ] = Field(
        None,
        description="Accepted where it only clears thinking blocks, which this model never writes.",
    )


def chat_messages(system: str, messages: list[Message]) -> list[dict]:
    """Anthropic's conversation as chat messages: tool results become tool messages (before the
    user's text that came with them), an assistant's tool_use blocks its tool calls."""
    out = [{"role": "system", "content": system}] if system else []
    for m in messages:
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        texts, calls = [], []
        for b in m.content:
            if b.type == "text":
                texts.append(b.text)
            elif b.type == "tool_use":
                calls.append(
                    {
                        "id": b.id,
                        "type": "function",
                        "function": {"name": b.name, "arguments": json.dumps(b.input)},
                    }
                )
            elif b.type == "tool_result":
                out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()})
        if m.role == "assistant":
            out.append(
                {"role": "assistant", "content": "".join(texts)}
                | ({"tool_calls": calls} if calls else {})
            )
        elif texts or not any(b.type == "tool_result" for b in m.content):
            out.append({"role": m.role, "content": "".join(texts)})
    return out


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
    """Anthropic's usage: `input_tokens` the prompt's tokens after the last cache read, which
    `cache_read_input_tokens` counts (the prompt cache is automatic here: nothing is counted as
    written)."""
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
                stream(head, used, events, window), media_type="text/event-stream"
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


async def stream(head: dict, used: int, events, window: bool):
    """Anthropic's event sequence: message_start, ping, each content block's start, deltas and
    stop, message_delta (stop_reason, usage), message_stop; a failure mid-way is an `error`
    event. As in Anthropic's API, message_start comes once the prompt is read, and its usage
    splits the prompt into `input_tokens` and `cache_read_input_tokens` as the final usage does."""

    def start(cached: int) -> str:
        usage = prompt_usage(used, cached) | {"output_tokens": 0}
        return named_sse(
            {
                "type": "message_start",
                "message": head
                | {"content": [], "stop_reason": None, "stop_sequence": None, "usage": usage},
            }
        ) + named_sse({"type": "ping"})

    index, text_open, blank, calls, started = 0, False, "", [], False
    async for kind, value in events:
        if kind == "start":
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
