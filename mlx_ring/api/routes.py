"""The OpenAI-compatible HTTP API on rank 0 (FastAPI). It never touches MLX: it tokenizes, queues
requests for the engine thread, and turns the engine's events into OpenAI responses."""

import asyncio
import hmac
import json
import math
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from mlx_ring.serving.engine import Delta, Done, Engine, Failed, QueueFull, Request, Unavailable
from mlx_ring.api.schema import ChatCompletionRequest, CompletionRequest, ids_below

log = logging.getLogger(__name__)


@dataclass
class ServedModel:
    id: str
    tokenizer: object  # mlx_lm TokenizerWrapper; tokenizing needs no MLX
    context_length: int
    default_max_tokens: int
    vocab_size: int  # token ids a request may name are in [0, vocab_size): the model's and the tokenizer's
    max_tokens_limit: int = 0  # most completion tokens one request may ask for; 0: the context length
    cluster: dict = field(default_factory=dict)  # static per-rank facts gathered at startup


class ApiError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param=None, code=None, headers=None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers


def error_body(message: str, type: str, param=None, code=None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    msg = first.get("msg", "invalid request").removeprefix("Value error, ")
    param = loc[0] if loc else None
    if param is None and ": " in msg:  # model-level checks name their field as "field: why"
        param = msg.split(": ", 1)[0]
    if first.get("type") == "json_invalid":
        msg, param, loc = "the request body is not valid JSON", None, []
    elif first.get("type") in ("model_attributes_type", "dict_type") and not loc:
        msg = "the request body must be a JSON object"
    text = f"{'.'.join(loc)}: {msg}" if loc else msg
    return JSONResponse(error_body(text, "invalid_request_error", param), status_code=400)


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


def make_app(engine: Engine, served: ServedModel, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="mlx-ring", description="One model split across a ring of MLX ranks, served as OpenAI.")
    app.add_middleware(JsonBodies)
    if api_key:
        app.add_middleware(BearerAuth, key=api_key)

    @app.exception_handler(RequestValidationError)
    async def _on_validation(_, exc):
        return _validation_error(exc)

    @app.exception_handler(ApiError)
    async def _on_api_error(_, exc: ApiError):
        return JSONResponse(error_body(exc.message, exc.type, exc.param, exc.code), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(_, exc):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code, headers=getattr(exc, "headers", None))

    # Tokenizing a long prompt takes a while (100k tokens: ~0.2 s here), so it runs off the event
    # loop, which keeps streaming meanwhile. One thread: a Hugging Face tokenizer is not safe to
    # reconfigure from several threads at once, and the chat template path may.
    tokenizing = ThreadPoolExecutor(1, thread_name_prefix="tokenize")

    async def off_loop(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(tokenizing, fn, *args)

    def check_ids(field: str, ids) -> None:
        """Every token id a request names must index the model's vocabulary: MLX does not check
        bounds when it gathers or scatters, and an id past the end crashes the process."""
        bad = next((t for t in ids if not 0 <= t < served.vocab_size), None)
        if bad is not None:
            raise ApiError(400, f"{field}: token id {bad} is outside this model's vocabulary; use ids in [0, {served.vocab_size})", param=field)

    def check_sampling(body) -> None:
        check_ids("logit_bias", [int(k) for k in body.logit_bias or {}])
        if body.top_k >= served.vocab_size:
            raise ApiError(400, f"top_k: {body.top_k} keeps the whole vocabulary of {served.vocab_size} tokens or more; use 0 (off) or fewer", param="top_k")

    def check_model(name: str | None) -> None:
        if name not in (None, "", served.id, "default"):
            raise ApiError(404, f"The model '{name}' does not exist; this server serves '{served.id}'", "invalid_request_error", "model", "model_not_found")

    def limit_tokens(prompt: list[int], body) -> int:
        room = served.context_length - len(prompt)
        if room <= 0:
            raise ApiError(400, f"the prompt has {len(prompt)} tokens but the model's context is {served.context_length}; shorten it", param="messages", code="context_length_exceeded")
        cap = served.max_tokens_limit or served.context_length
        for name in ("max_tokens", "max_completion_tokens"):
            asked = getattr(body, name, None)
            if asked is not None and asked > cap:
                raise ApiError(400, f"{name}={asked} is over this server's limit of {cap} (MAX_TOKENS_LIMIT); ask for fewer", param=name)
        asked = body.token_limit()
        if asked is not None and asked > room:
            raise ApiError(400, f"max_tokens={asked} plus the prompt's {len(prompt)} tokens exceeds the context of {served.context_length}; ask for at most {room}", param="max_tokens", code="context_length_exceeded")
        return asked if asked is not None else min(room, cap, body.default_tokens or served.default_max_tokens)

    def submit(req: Request) -> asyncio.Queue:
        """Queue `req` for the engine; its events arrive on the returned asyncio queue."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        req.emit = lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev)
        try:
            engine.submit(req)
        except QueueFull as e:
            raise ApiError(503, f"the server is busy ({e}); retry shortly", "server_overloaded", headers={"Retry-After": "1"}) from None
        except Unavailable as e:
            raise ApiError(503, f"the server is not taking requests: {e}", "service_unavailable", headers={"Retry-After": "5"}) from None
        return events

    async def run(req: Request, events: asyncio.Queue, http: HttpRequest):
        """Yield the engine's events for `req`; marks it cancelled on exit (a no-op once finished)."""
        async def watch_disconnect():
            # The body is already read, so the next ASGI message is the client hanging up.
            while (await http.receive())["type"] != "http.disconnect":
                pass
            req.cancelled.set()

        watcher = asyncio.create_task(watch_disconnect())
        try:
            while True:
                ev = await events.get()
                yield ev
                if isinstance(ev, (Done, Failed)):
                    return
        finally:
            watcher.cancel()
            req.cancelled.set()  # frees the sequence on every rank if the client went away

    def make_request(body, prompt: list[int]) -> Request:
        top = body.logprob_count()
        return Request(prompt, limit_tokens(prompt, body), body.sampling(top or 0), emit=None, stop=body.stops())

    def chat_prompt(body: ChatCompletionRequest) -> list[int]:
        messages = [{"role": m.role, "content": m.text()} | ({"name": m.name} if m.name else {}) for m in body.messages]
        try:
            return served.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        except Exception as e:
            raise ApiError(400, f"messages: cannot apply the chat template: {e}", param="messages") from None

    def encode(text: str) -> list[int]:
        try:
            return served.tokenizer.encode(text)
        except Exception as e:  # e.g. a lone surrogate escaped in the JSON
            raise ApiError(400, f"prompt: cannot be tokenized: {e}", param="prompt") from None

    def token_text(tid: int) -> str:
        return served.tokenizer.decode([tid])

    def finite(lp: float) -> float:
        return lp if math.isfinite(lp) else -9999.0  # as OpenAI reports impossible tokens; JSON has no -inf

    def chat_logprobs(tokens, top: int | None):
        if top is None:
            return None
        content = []
        for t in tokens:
            s = token_text(t.id)
            content.append({
                "token": s, "logprob": finite(t.logprob), "bytes": list(s.encode()),
                "top_logprobs": [{"token": token_text(i), "logprob": finite(lp), "bytes": list(token_text(i).encode())} for i, lp in t.top[:top]],
            })
        return {"content": content}

    def completion_logprobs(tokens, top: int | None):
        if top is None:
            return None
        return {
            "tokens": [token_text(t.id) for t in tokens],
            "token_logprobs": [finite(t.logprob) for t in tokens],
            "top_logprobs": [{token_text(i): finite(lp) for i, lp in t.top[:top]} for t in tokens] if top else None,
        }

    def usage(done: Done) -> dict:
        return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens, "total_tokens": done.prompt_tokens + done.completion_tokens}

    async def respond(body, prompt: list[int], http: HttpRequest, chat: bool):
        req = make_request(body, prompt)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created, top = int(time.time()), body.logprob_count()
        obj = "chat.completion" if chat else "text_completion"
        events = submit(req)  # before any byte is sent, so a full queue is a plain 503
        if body.stream:
            return StreamingResponse(stream(req, events, http, rid, created, top, chat, body), media_type="text/event-stream")
        text, tokens = [], []
        async for ev in run(req, events, http):
            if isinstance(ev, Delta):
                text.append(ev.text)
                tokens.extend(ev.tokens)
            elif isinstance(ev, Failed):
                raise ApiError(ev.status, ev.message, ev.type)
            else:
                done = ev
        content = "".join(text)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": chat_logprobs(tokens, top), "finish_reason": done.finish_reason}
        else:
            choice = {"index": 0, "text": content, "logprobs": completion_logprobs(tokens, top), "finish_reason": done.finish_reason}
        return {"id": rid, "object": obj, "created": created, "model": served.id, "choices": [choice], "usage": usage(done)}

    async def stream(req, events, http, rid, created, top, chat, body):
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta_or_text, finish=None, logprobs=None):
            choice = {"index": 0, "logprobs": logprobs, "finish_reason": finish}
            choice["delta" if chat else "text"] = delta_or_text
            return sse({"id": rid, "object": obj, "created": created, "model": served.id, "choices": [choice]})

        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        if chat:
            yield chunk({"role": "assistant", "content": ""})
        async for ev in run(req, events, http):
            if isinstance(ev, Delta):
                lp = chat_logprobs(ev.tokens, top) if chat else completion_logprobs(ev.tokens, top)
                yield chunk({"content": ev.text} if chat else ev.text, logprobs=lp)
            elif isinstance(ev, Failed):
                yield sse(error_body(ev.message, ev.type))
                break
            else:
                yield chunk({} if chat else "", finish=ev.finish_reason)
                if include_usage:
                    yield sse({"id": rid, "object": obj, "created": created, "model": served.id, "choices": [], "usage": usage(ev)})
        yield "data: [DONE]\n\n"

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, http: HttpRequest):
        check_model(body.model)
        check_sampling(body)
        prompt = await off_loop(chat_prompt, body)
        check_ids("messages", prompt)  # a tokenizer may know ids (added tokens) the model has no row for
        return await respond(body, prompt, http, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: HttpRequest):
        check_model(body.model)
        check_sampling(body)
        prompt = body.prompt if isinstance(body.prompt, list) else await off_loop(encode, body.prompt)
        if not prompt:
            raise ApiError(400, "prompt: must be non-empty text or token ids", param="prompt")
        check_ids("prompt", prompt)
        return await respond(body, prompt, http, chat=False)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served.id, "object": "model", "created": 0, "owned_by": "mlx-ring"}]}

    async def on_engine(fut, timeout: float):
        return await asyncio.wait_for(asyncio.wrap_future(fut), timeout)

    @app.get("/health")
    async def health():
        t0 = time.perf_counter()
        if engine.broken or engine.stopping.is_set():
            return JSONResponse({"status": "unavailable", "error": engine.broken or "shutting down"}, status_code=503)
        try:
            await on_engine(engine.ping(), timeout=10)  # a real trip through every rank
        except Exception as e:
            return JSONResponse({"status": "unhealthy", "error": str(e) or type(e).__name__}, status_code=503)
        return {"status": "ok", "ranks": len(served.cluster.get("ranks", [])), "ring_round_trip_ms": round((time.perf_counter() - t0) * 1e3, 2)}

    @app.get("/cluster/status")
    async def cluster_status():
        try:
            live = await on_engine(engine.status(), timeout=10)
        except Exception as e:
            raise ApiError(503, f"the ring did not answer: {e}", "server_error") from None
        ranks = [static | dyn for static, dyn in zip(served.cluster["ranks"], live)]
        return {"model": served.id, "plan": served.cluster["plan"], "ranks": ranks, "queued_requests": engine.requests.qsize()}

    def openapi():
        # FastAPI documents validation failures as 422; this server answers 400 in OpenAI's shape.
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version="1", description=app.description, routes=app.routes)
            error = {"description": "Bad request, in OpenAI's error shape", "content": {"application/json": {"schema": ERROR_SCHEMA}}}
            for ops in schema["paths"].values():
                for op in ops.values():
                    responses = op.setdefault("responses", {})
                    responses.pop("422", None)
                    if "requestBody" in op:
                        ok = responses.setdefault("200", {"description": "OK"}).setdefault("content", {})
                        # with "stream": true: server-sent events whose data is a JSON chunk or [DONE]
                        ok["text/event-stream"] = {"schema": {"type": "object", "properties": {"data": {"type": "string"}}}}
                        responses["400"] = error
                        responses["404"] = error | {"description": "Unknown model"}
                        responses["503"] = error | {"description": "Busy, draining or the ring is down"}
                    if op.get("operationId", "").startswith(("health", "cluster")):
                        responses["503"] = {"description": "The ring does not answer"}
            # Limits known only at run time: completion length, and token ids of this vocabulary.
            schemas = schema["components"]["schemas"]
            for name, prop in (("ChatCompletionRequest", "max_tokens"), ("ChatCompletionRequest", "max_completion_tokens"),
                                ("CompletionRequest", "max_tokens")):
                for branch in schemas[name]["properties"][prop].get("anyOf", [schemas[name]["properties"][prop]]):
                    if branch.get("type") == "integer":
                        branch["maximum"] = served.max_tokens_limit or served.context_length
            for branch in schemas["CompletionRequest"]["properties"]["prompt"]["anyOf"]:
                if branch.get("type") == "array":
                    branch["items"]["maximum"] = served.vocab_size - 1
            for name in ("ChatCompletionRequest", "CompletionRequest"):
                props = schemas[name]["properties"]
                props["top_k"]["maximum"] = served.vocab_size - 1
                for branch in props["logit_bias"].get("anyOf", [props["logit_bias"]]):
                    if branch.get("type") == "object":  # keys: token ids below the vocabulary's size
                        branch["patternProperties"] = {ids_below(served.vocab_size): branch["patternProperties"].popitem()[1]}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
    return app


ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"
