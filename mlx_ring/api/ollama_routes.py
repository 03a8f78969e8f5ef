"""Ollama's API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`,
`/api/version`) as a thin adapter: its requests (ollama.py) become the one internal request, the
engine's events become Ollama's JSON or its NDJSON stream, errors `{"error": ...}`."""

import hashlib
import json
import time
from datetime import datetime, timezone

from fastapi import APIRouter
from fastapi import Request as HttpRequest
from fastapi.responses import Response, StreamingResponse

from mlx_ring.api.bodies import Bodies
from mlx_ring.api.dialects import arguments, chat_request, collect, dialect_router
from mlx_ring.api.errors import ApiError
from mlx_ring.api.front import Front
from mlx_ring.api.ollama import (
    NAMES,
    ChatRequest,
    GenerateRequest,
    ShowRequest,
    _Generating,
    chat_messages,
)
from mlx_ring.api.openai_request import CompletionRequest
from mlx_ring.api.openapi import body_of
from mlx_ring.api.served import ServedModel

# What /api/version reports: the Ollama API this adapter follows (clients check it for features).
OLLAMA_VERSION = "0.12.0"

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
}
# with "stream" true or left out: one JSON object a line
NDJSON = {
    200: {"description": "OK", "content": {"application/x-ndjson": {"schema": {"type": "string"}}}}
}


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
    """Ollama's `details` of a model held as MLX safetensors: family the
    architecture, size and weights."""
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
