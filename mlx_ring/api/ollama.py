"""Ollama's API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`, `/api/version`) as a
thin adapter: chat and generate become the one internal request (options mapped to the same sampling
parameters), the engine's events become Ollama's JSON or its NDJSON stream, errors `{"error": ...}`."""

import hashlib
import json
import time
from datetime import datetime, timezone
from typing import ClassVar, Literal

from fastapi import APIRouter
from fastapi import Request as HttpRequest
from fastapi.responses import StreamingResponse
from pydantic import ConfigDict, Field, model_validator

from mlx_ring.api.dialects import OPENAPI, Engine, arguments, chat_request, collect, error_routes
from mlx_ring.api.errors import ApiError
from mlx_ring.api.schema import CompletionRequest, _Strict
from mlx_ring.api.served import ServedModel, check_model

# What /api/version reports: the Ollama API this adapter follows (clients check it for features).
OLLAMA_VERSION = "0.12.0"
# Ollama option -> the internal request's field; other options (num_ctx, num_gpu, mirostat...) are ignored.
OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed",
           "stop": "stop", "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
           "frequency_penalty": "frequency_penalty"}


class Options(_Strict):
    model_config = ConfigDict(extra="allow")  # Ollama's load-time and other options: accepted, ignored
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    num_predict: int | None = Field(None, description="Most tokens to generate; -1 or -2: as many as fit.")


class Call(_Strict):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: dict


class ToolCallOut(_Strict):
    model_config = ConfigDict(extra="allow")
    function: Call


class Message(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[ToolCallOut] | None = None
    tool_name: str | None = None
    thinking: str | None = Field(None, description="Accepted and dropped: this server does not think apart.")

    @model_validator(mode="after")
    def _check(self):
        if self.images:
            raise ValueError("images are not supported by this text model; send text")
        return self


class _Generating(_Strict):
    model: str = Field(min_length=1)
    stream: bool = True
    format: Literal["", "json"] | dict | None = None
    options: Options | None = None
    keep_alive: float | int | str | None = Field(None, description="Accepted and ignored: the ring keeps its model.")
    think: bool | Literal["low", "medium", "high"] | None = None

    @model_validator(mode="after")
    def _no_thinking(self):
        if self.think:
            raise ValueError("think: not supported by this server; leave it unset or false")
        return self

    def fields(self) -> dict:
        """The internal request's sampling fields."""
        opts = self.options or Options()
        fields = {ours: getattr(opts, theirs) for theirs, ours in OPTIONS.items() if getattr(opts, theirs) is not None}
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
    tools: list[dict] | None = None


class GenerateRequest(_Generating):
    unsupported: ClassVar[dict[str, str]] = {"images": "it is a text model; send text"}
    harmless: ClassVar[dict[str, object]] = {"images": []}
    prompt: str = ""
    system: str | None = None
    raw: bool = False
    suffix: Literal[""] | None = Field(None, description="Not supported: fill-in-the-middle needs a model that has it.")
    template: Literal[""] | None = Field(None, description="Not supported: the model's own chat template is used.")
    context: list[int] | None = Field(None, max_length=0, description="Not supported (deprecated by Ollama): send the conversation to /api/chat.")
    images: list[str] | None = Field(None, max_length=0, description="Not supported: this model reads text only.")


class ShowRequest(_Strict):
    model: str = Field(min_length=1)
    verbose: bool | None = None


WHERE = {ours: f"options.{theirs}" for theirs, ours in OPTIONS.items()} | {"max_tokens": "options.num_predict", "response_format": "format"}


def chat_messages(messages: list[Message]) -> list[dict]:
    """Ollama's messages as chat messages: its tool calls and results carry no ids, so each call gets
    one and each tool result takes the id of the first open call of its name (else the first open)."""
    out, open_calls = [], []
    for n, m in enumerate(messages):
        msg = {"role": m.role, "content": m.content}
        if m.tool_calls:
            calls = [{"id": f"call_{n}_{k}", "type": "function", "function": {"name": c.function.name, "arguments": json.dumps(c.function.arguments)}}
                     for k, c in enumerate(m.tool_calls)]
            msg["tool_calls"], open_calls = calls, list(calls)
        if m.role == "tool":
            match = next((c for c in open_calls if c["function"]["name"] == m.tool_name), open_calls[0] if open_calls else None)
            if match:
                open_calls.remove(match)
            msg["tool_call_id"] = match["id"] if match else f"call_{n}"
        out.append(msg)
    return out


def now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def details(served: ServedModel) -> dict:
    return {"parent_model": "", "format": "safetensors", "family": "", "families": [], "parameter_size": "", "quantization_level": ""}


def listing(served: ServedModel) -> dict:
    size = sum(r.get("parameter_bytes_kib", 0) for r in served.cluster.ranks) * 1024
    return {"name": served.id, "model": served.id, "modified_at": "1970-01-01T00:00:00Z", "size": size,
            "digest": hashlib.sha256(served.id.encode()).hexdigest(), "details": details(served)}


class Timing:
    """Ollama's counts and durations (nanoseconds) for the closing object."""

    def __init__(self):
        self.start = self.first = time.monotonic_ns()

    def mark(self) -> None:
        if self.first == self.start:
            self.first = time.monotonic_ns()

    def closing(self, done) -> dict:
        end = time.monotonic_ns()
        return {"done": True, "done_reason": done.finish_reason, "total_duration": end - self.start, "load_duration": 0,
                "prompt_eval_count": done.prompt_tokens, "prompt_eval_duration": self.first - self.start,
                "eval_count": done.completion_tokens, "eval_duration": end - self.first}


def ollama_calls(calls: list[dict]) -> list[dict]:
    return [{"function": {"index": i, "name": c["function"]["name"], "arguments": arguments(c)}} for i, c in enumerate(calls)]


def ollama_routes(engine: Engine) -> APIRouter:
    router = APIRouter(route_class=error_routes(lambda status, openai: {"error": openai["error"]["message"]}), include_in_schema=OPENAPI)
    served = engine.served

    @router.post("/api/chat")
    async def chat(body: ChatRequest, http: HttpRequest):
        fields = body.fields() | {"messages": chat_messages(body.messages)}
        if body.tools:
            fields["tools"] = body.tools
        if body.response_format():
            fields["response_format"] = body.response_format()
        if not body.messages:  # as Ollama: an empty chat only loads the model
            check_model(served, fields["model"])
            return {"model": body.model, "created_at": now(), "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "load"}
        request = chat_request(fields, WHERE | {"tools": "tools", "messages": "messages"})
        timing = Timing()
        _, events = await engine.events(request, http)
        return await answer(body, events, timing, lambda text, calls=None: {
            "message": {"role": "assistant", "content": text} | ({"tool_calls": ollama_calls(calls)} if calls else {})})

    @router.post("/api/generate")
    async def generate(body: GenerateRequest, http: HttpRequest):
        fields = body.fields()
        if not body.prompt:  # as Ollama: an empty prompt only loads the model
            check_model(served, fields["model"])
            return {"model": body.model, "created_at": now(), "response": "", "done": True, "done_reason": "load"}
        timing = Timing()
        if body.raw:
            if body.response_format():
                raise ApiError(400, "format: not supported with raw; use the chat template (raw false) or /api/chat")
            _, events = await engine.raw_events(chat_request(fields | {"prompt": body.prompt}, WHERE, CompletionRequest), http)
        else:
            messages = ([{"role": "system", "content": body.system}] if body.system else []) + [{"role": "user", "content": body.prompt}]
            fields |= {"messages": messages} | ({"response_format": body.response_format()} if body.response_format() else {})
            _, events = await engine.events(chat_request(fields, WHERE), http)
        return await answer(body, events, timing, lambda text, calls=None: {"response": text})

    @router.get("/api/tags")
    async def tags():
        return {"models": [listing(served)]}

    @router.get("/api/ps")
    async def ps():
        entry = listing(served)
        return {"models": [entry | {"expires_at": "2999-01-01T00:00:00Z", "size_vram": entry["size"], "context_length": served.context_length}]}

    @router.post("/api/show")
    async def show(body: ShowRequest):
        check_model(served, body.model.removesuffix(":latest"))
        tok = served.tokenizer
        return {"modelfile": "", "parameters": "", "template": getattr(tok, "chat_template", None) or "", "details": details(served),
                "model_info": {"general.architecture": "", "general.context_length": served.context_length},
                "capabilities": ["completion"] + (["tools"] if getattr(tok, "has_tool_calling", False) else []), "modified_at": "1970-01-01T00:00:00Z"}

    @router.get("/api/version")
    async def version():
        return {"version": OLLAMA_VERSION}

    return router


async def answer(body: _Generating, events, timing: Timing, shape):
    """Ollama's whole answer, or its NDJSON stream: a line per piece, then the closing line with counts;
    a failure mid-way is an `{"error": ...}` line."""
    head = {"model": body.model}
    if not body.stream:
        text, calls, done = await collect(events)
        return head | {"created_at": now()} | shape(text, calls) | timing.closing(done)

    async def lines():
        async for kind, value in events:
            timing.mark()
            if kind == "text":
                yield json.dumps(head | {"created_at": now()} | shape(value) | {"done": False}) + "\n"
            elif kind == "call":
                yield json.dumps(head | {"created_at": now()} | shape("", [value]) | {"done": False}) + "\n"
            elif kind == "failed":
                yield json.dumps({"error": value.message}) + "\n"
                return
            else:
                yield json.dumps(head | {"created_at": now()} | shape("") | timing.closing(value)) + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")
