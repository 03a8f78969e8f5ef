"""Ollama's API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`,
`/api/version`) as a thin adapter: chat and generate become the one internal request (options
mapped to the same sampling parameters), the engine's events become Ollama's JSON or its NDJSON
stream, errors `{"error": ...}`."""

import hashlib
import json
import re
import time
from datetime import datetime, timezone
from typing import Annotated, ClassVar, Literal

from fastapi import APIRouter
from fastapi import Request as HttpRequest
from fastapi.responses import Response, StreamingResponse
from pydantic import ConfigDict, Field, WithJsonSchema, model_validator

from mlx_ring.api.bodies import Bodies
from mlx_ring.api.dialects import arguments, chat_request, collect, dialect_router
from mlx_ring.api.errors import ApiError
from mlx_ring.api.front import Front
from mlx_ring.api.openai_request import CompletionRequest, Tool
from mlx_ring.api.openapi import body_of
from mlx_ring.api.schema import _Strict, bounds_of, only_with
from mlx_ring.api.served import ServedModel

# What /api/version reports: the Ollama API this adapter follows (clients check it for features).
OLLAMA_VERSION = "0.12.0"
# Ollama option -> the internal request's field; other options (num_ctx, num_gpu, mirostat...) are
# ignored.
OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "stop": "stop",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
# The internal request's field -> the client's, for the 400 of a bad value (dialects.chat_request).
NAMES = {ours: f"options.{theirs}" for theirs, ours in OPTIONS.items()}
NAMES["max_tokens"] = "options.num_predict"


ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
}
# with "stream" true or left out: one JSON object a line
NDJSON = {
    200: {"description": "OK", "content": {"application/x-ndjson": {"schema": {"type": "string"}}}}
}


def _bounded(option: str):
    """An option that the internal request's field checks when it is built, by its bounds."""
    return Field(None, json_schema_extra=bounds_of(OPTIONS[option]))


class Options(_Strict):
    # Ollama's load-time and other options: accepted, ignored
    model_config = ConfigDict(extra="allow")
    temperature: float | None = _bounded("temperature")
    top_p: float | None = _bounded("top_p")
    top_k: int | None = _bounded("top_k")
    min_p: float | None = _bounded("min_p")
    seed: int | None = _bounded("seed")
    stop: list[str] | None = _bounded("stop")
    repeat_penalty: float | None = _bounded("repeat_penalty")
    presence_penalty: float | None = _bounded("presence_penalty")
    frequency_penalty: float | None = _bounded("frequency_penalty")
    num_predict: int | None = Field(
        None, description="Most tokens to generate; -1 or -2: as many as fit."
    )


class Call(_Strict):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: dict


class ToolCallOut(_Strict):
    model_config = ConfigDict(extra="allow")
    function: Call


class Message(_Strict):
    model_config = ConfigDict(
        json_schema_extra=only_with(
            "tool_calls", "role", {"type": "array", "minItems": 1}, {"const": "assistant"}
        )
    )
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: Annotated[
        list[str] | None,
        WithJsonSchema({"anyOf": [{"type": "array", "maxItems": 0}, {"type": "null"}]}),
    ] = Field(None, description="Not supported: this model reads text only.")
    tool_calls: list[ToolCallOut] | None = None
    tool_name: str | None = None
    thinking: str | None = Field(
        None, description="Accepted and dropped: this server does not think apart."
    )

    @model_validator(mode="after")
    def _check(self):
        if self.images:
            raise ValueError("images are not supported by this text model; send text")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant message carries tool_calls")
        return self


class _Generating(_Strict):
    model: str = Field(min_length=1)
    stream: bool = True
    format: Literal["", "json"] | dict | None = None
    options: Options | None = None
    keep_alive: float | int | str | None = Field(
        None, description="Accepted and ignored: the ring keeps its model."
    )
    think: Annotated[
        bool | Literal["low", "medium", "high"] | None, WithJsonSchema({"enum": [False, None]})
    ] = Field(None, description="Not supported: false or left out.")

    @model_validator(mode="after")
    def _no_thinking(self):
        if self.think:
            raise ValueError("think: not supported by this server; leave it unset or false")
        return self

    def unloads(self) -> bool:
        """keep_alive 0 (as a number or a Go duration such as "0s"): with nothing to answer,
        Ollama unloads."""
        k = self.keep_alive
        return (
            k == 0
            if not isinstance(k, str)
            else bool(re.fullmatch(r"0+(\.0*)?((ns|us|µs|ms|s|m|h)(0+(\.0*)?)?)*", k.strip()))
        )

    def fields(self) -> dict:
        """The internal request's sampling fields."""
        opts = self.options or Options()
        fields = {
            ours: getattr(opts, theirs)
            for theirs, ours in OPTIONS.items()
            if getattr(opts, theirs) is not None
        }
        if opts.num_predict is not None and opts.num_predict > 0:
            fields["max_tokens"] = opts.num_predict
        model = self.model.removesuffix(":latest")
        return fields | {"model": model, "stream": self.stream}

    def response_format(self) -> dict | None:
        if self.format == "json":
            return {"type": "json_object"}
        if isinstance(self.format, dict):
            return {"type": "json_schema", "json_schema": {"name": "format", "schema": self.format}}
        return None


class ChatRequest(_Generating):
    messages: list[Message] = Field(default_factory=list)
    tools: list[Tool] | None = Field(None, max_length=128)


class GenerateRequest(_Generating):
    model_config = ConfigDict(
        json_schema_extra=only_with("raw", "format", {"const": True}, {"enum": ["", None]})
    )
    unsupported: ClassVar[dict[str, str]] = {"images": "it is a text model; send text"}
    harmless: ClassVar[dict[str, object]] = {"images": []}
    prompt: str = ""
    system: str | None = None
    raw: bool = False
    suffix: Literal[""] | None = Field(
        None, description="Not supported: fill-in-the-middle needs a model that has it."
    )
    template: Literal[""] | None = Field(
        None, description="Not supported: the model's own chat template is used."
    )
    context: list[int] | None = Field(
        None,
        max_length=0,
        description="Not supported (deprecated by Ollama): send the conversation to /api/chat.",
    )
    images: list[str] | None = Field(
        None, max_length=0, description="Not supported: this model reads text only."
    )

    @model_validator(mode="after")
    def _raw(self):
        if self.raw and self.response_format():
            raise ValueError(
                "format: not supported with raw; use the chat template (raw false) or /api/chat"
            )
        return self


class ShowRequest(_Strict):
    """As the Ollama client sends it (api/types.go: every field, empty ones too)."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": [f], "properties": {f: {"minLength": 1}}} for f in ("model", "name")
            ]
        }
    )

    model: str = ""
    name: str = Field("", description="Deprecated by Ollama: the model, when `model` is empty.")
    verbose: bool | None = None
    system: str | None = Field(
        None, description="Accepted and ignored: the answer shows no Modelfile."
    )
    template: str | None = Field(None, description="Accepted and ignored (deprecated by Ollama).")
    options: dict | None = Field(
        None, description="Accepted and ignored: the answer shows no Modelfile."
    )

    @model_validator(mode="after")
    def _named(self):
        if not (self.model or self.name):
            raise ValueError("model is required")
        return self


def chat_messages(messages: list[Message]) -> list[dict]:
    """Ollama's messages as chat messages: its tool calls and results carry no ids, so each call
    gets one and each tool result takes the id of the first open call of its name (else the first
    open)."""
    out, open_calls = [], []
    for n, m in enumerate(messages):
        msg = {"role": m.role, "content": m.content}
        if m.tool_calls:
            calls = [
                {
                    "id": f"call_{n}_{k}",
                    "type": "function",
                    "function": {
                        "name": c.function.name,
                        "arguments": json.dumps(c.function.arguments),
                    },
                }
                for k, c in enumerate(m.tool_calls)
            ]
            msg["tool_calls"], open_calls = calls, list(calls)
        if m.role == "tool":
            match = next(
                (c for c in open_calls if c["function"]["name"] == m.tool_name),
                open_calls[0] if open_calls else None,
            )
            if match:
                open_calls.remove(match)
            msg["tool_call_id"] = match["id"] if match else f"call_{n}"
        out.append(msg)
    return out


def known(served: ServedModel, name: str) -> None:
    """A 404 in Ollama's words (`model '...' not found`, which its CLI looks for) unless the model
    answers to `name` (`:latest` is the same model)."""
    if not served.answers_to(name.removesuffix(":latest")):
        raise ApiError(
            404,
            (
                f"model '{name}' not found; this server serves '{served.id}' "
                "(MODEL_ALIASES adds other names)"
            ),
            param="model",
            code="model_not_found",
        )


def now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def human_number(n: int) -> str:
    """A parameter count as Ollama writes it (its format.HumanNumber): 135M, 134.52M, 1.5B, 7B."""
    for unit, size in (("B", 10**9), ("M", 10**6)):
        if n >= size:
            x = n / size
            return f"{x:.0f}{unit}" if x == int(x) else f"{x:.{1 if unit == 'B' else 2}f}{unit}"
    return f"{n / 1000:.0f}K" if n >= 1000 else str(n)


def architecture(served: ServedModel) -> str:
    return served.config.get("model_type", "")


def details(served: ServedModel) -> dict:
    """Ollama's `details` of a model held as MLX safetensors: family the architecture, size and
    weights."""
    arch = architecture(served)
    return {
        "parent_model": "",
        "format": "safetensors",
        "family": arch,
        "families": [arch] if arch else None,
        "parameter_size": human_number(served.parameters) if served.parameters else "",
        "quantization_level": served.weights,
    }


def model_info(served: ServedModel) -> dict:
    """`/api/show`'s `model_info` as Ollama builds it from a config.json (x/server/show.go): the
    architecture, then its sizes (models/shape.py's reading) under `<architecture>.`; the context
    length is the one served."""
    s = served.shape
    arch = architecture(served)
    sizes = (
        {
            "embedding_length": s.hidden_size,
            "block_count": s.layers,
            "attention.head_count": s.heads,
            "attention.head_count_kv": s.kv_heads,
            "feed_forward_length": s.intermediate_size,
            "vocab_size": s.vocab_size,
        }
        if s
        else {}
    )
    info = {
        "general.architecture": arch,
        "general.basename": served.id,
        f"{arch}.context_length": served.context_length,
    }
    info |= {f"{arch}.{k}": v for k, v in sizes.items() if v}
    return info | ({"general.parameter_count": served.parameters} if served.parameters else {})


def listing(served: ServedModel, name: str) -> dict:
    size = sum(r.parameter_bytes_kib for r in served.cluster.ranks) * 1024
    return {
        "name": name,
        "model": name,
        "modified_at": "1970-01-01T00:00:00Z",
        "size": size,
        "digest": hashlib.sha256(served.id.encode()).hexdigest(),
        "details": details(served),
    }


class Timing:
    """Ollama's counts and durations (nanoseconds) for the closing object."""

    def __init__(self):
        self.start = self.first = time.monotonic_ns()

    def mark(self) -> None:
        if self.first == self.start:
            self.first = time.monotonic_ns()

    async def timed(self, events):
        """The events, the first one marking the end of the prompt's evaluation."""
        async for event in events:
            self.mark()
            yield event

    def closing(self, done) -> dict:
        end = time.monotonic_ns()
        return {
            "done": True,
            "done_reason": done.finish_reason,
            "total_duration": end - self.start,
            "load_duration": 0,
            "prompt_eval_count": done.prompt_tokens,
            "prompt_eval_duration": self.first - self.start,
            "eval_count": done.completion_tokens,
            "eval_duration": end - self.first,
        }


def ollama_calls(calls: list[dict]) -> list[dict]:
    return [
        {"function": {"index": i, "name": c["function"]["name"], "arguments": arguments(c)}}
        for i, c in enumerate(calls)
    ]


def ollama_routes(front: Front, bodies: Bodies) -> APIRouter:
    router = dialect_router(
        lambda status, openai: {"error": openai["error"]["message"]}, ERROR_SCHEMA
    )
    served = front.served

    @router.post("/api/chat", openapi_extra=body_of(ChatRequest), responses=NDJSON)
    async def chat(http: HttpRequest):
        body = await bodies.read(ChatRequest, await http.body())
        known(served, body.model)
        fields = body.fields() | {"messages": chat_messages(body.messages)}
        if body.tools:
            fields["tools"] = [t.model_dump(exclude_none=True) for t in body.tools]
        if body.response_format():
            fields["response_format"] = body.response_format()
        request = chat_request(fields, names=NAMES)
        # as Ollama: an empty chat only loads the model (or, keep_alive 0, unloads it)
        if not body.messages:
            front.check(request)  # what a chat with messages would be refused for
            return {
                "model": body.model,
                "created_at": now(),
                "message": {"role": "assistant", "content": ""},
                "done": True,
                "done_reason": "unload" if body.unloads() else "load",
            }
        timing = Timing()
        _, events = await front.events(request, http)
        return await answer(
            body,
            events,
            timing,
            lambda text, calls=None: {
                "message": {"role": "assistant", "content": text}
                | ({"tool_calls": ollama_calls(calls)} if calls else {})
            },
        )

    @router.post("/api/generate", openapi_extra=body_of(GenerateRequest), responses=NDJSON)
    async def generate(http: HttpRequest):
        body = await bodies.read(GenerateRequest, await http.body())
        known(served, body.model)
        fields = body.fields()
        # as Ollama: an empty prompt only loads the model (or, keep_alive 0, unloads it)
        if not body.prompt:
            front.check(chat_request(fields, names=NAMES))  # what a prompt would be refused for
            return {
                "model": body.model,
                "created_at": now(),
                "response": "",
                "done": True,
                "done_reason": "unload" if body.unloads() else "load",
            }
        timing = Timing()
        if body.raw:
            raw = chat_request(fields | {"prompt": body.prompt}, CompletionRequest, NAMES)
            _, events = await front.raw_events(raw, http)
        else:
            messages = ([{"role": "system", "content": body.system}] if body.system else []) + [
                {"role": "user", "content": body.prompt}
            ]
            fields |= {"messages": messages} | (
                {"response_format": body.response_format()} if body.response_format() else {}
            )
            _, events = await front.events(chat_request(fields, names=NAMES), http)
        return await answer(body, events, timing, lambda text, calls=None: {"response": text})

    @router.head("/", include_in_schema=False)
    async def heartbeat():
        """The Ollama CLI's check that a server is up, before run, list, ps, show and the others."""
        return Response(status_code=200)

    @router.head("/api/tags", include_in_schema=False)
    @router.get("/api/tags")
    async def tags():
        return {"models": [listing(served, name) for name in served.names()]}

    @router.get("/api/ps")
    async def ps():
        entry = listing(served, served.id)
        return {
            "models": [
                entry
                | {
                    "expires_at": "2999-01-01T00:00:00Z",
                    "size_vram": entry["size"],
                    "context_length": served.context_length,
                }
            ]
        }

    @router.post("/api/show", openapi_extra=body_of(ShowRequest))
    async def show(http: HttpRequest):
        body = await bodies.read(ShowRequest, await http.body())
        known(served, body.model or body.name)
        tok = served.tokenizer
        return {
            "modelfile": "",
            "parameters": "",
            "template": getattr(tok, "chat_template", None) or "",
            "details": details(served),
            "model_info": model_info(served),
            "capabilities": ["completion"]
            + (["tools"] if getattr(tok, "has_tool_calling", False) else []),
            "modified_at": "1970-01-01T00:00:00Z",
        }

    @router.head("/api/version", include_in_schema=False)
    @router.get("/api/version")
    async def version():
        return {"version": OLLAMA_VERSION}

    return router


async def answer(body: _Generating, events, timing: Timing, shape):
    """Ollama's whole answer, or its NDJSON stream: a line per piece, then the closing line with
    counts; a failure mid-way is an `{"error": ...}` line."""
    head = {"model": body.model}
    events = timing.timed(events)
    if not body.stream:
        text, calls, done = await collect(events)
        return head | {"created_at": now()} | shape(text, calls) | timing.closing(done)

    async def lines():
        async for kind, value in events:
            if kind == "text":
                yield (
                    json.dumps(head | {"created_at": now()} | shape(value) | {"done": False}) + "\n"
                )
            elif kind == "call":
                yield (
                    json.dumps(head | {"created_at": now()} | shape("", [value]) | {"done": False})
                    + "\n"
                )
            elif kind == "failed":
                yield json.dumps({"error": value.message}) + "\n"
                return
            else:
                yield (
                    json.dumps(head | {"created_at": now()} | shape("") | timing.closing(value))
                    + "\n"
                )

    return StreamingResponse(lines(), media_type="application/x-ndjson")
