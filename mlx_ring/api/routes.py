"""The OpenAI-compatible HTTP routes on rank 0 (FastAPI). They never touch MLX: they check a request
against the served model, tokenize it off the event loop, queue it for the engine thread, and turn
the engine's events into OpenAI responses."""

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from mlx_ring.api.errors import ApiError, error_body, validation_error
from mlx_ring.api.keys import Key, RateLimited, reserve_tokens, settle
from mlx_ring.api.metrics import Clock, CountRequests, RingMetrics
from mlx_ring.api.middleware import JsonBodies, KeyAuth
from mlx_ring.api.openapi import document
from mlx_ring.api.responses import chat_logprobs, completion_logprobs, sse, usage
from mlx_ring.api.schema import ChatCompletionRequest, CompletionRequest
from mlx_ring.api.served import ServedModel, check_ids, check_model, check_sampling, limit_tokens
from mlx_ring.serving.engine import Delta, Done, Engine, Failed, QueueFull, Request, Unavailable

log = logging.getLogger(__name__)


def make_app(engine: Engine, served: ServedModel, keys: list[Key] = (), restarts: int = 0) -> FastAPI:
    app = FastAPI(title="mlx-ring", description="One model split across a ring of MLX ranks, served as OpenAI.")
    app.add_middleware(JsonBodies)
    if keys:
        app.add_middleware(KeyAuth, keys=list(keys))
    metrics = RingMetrics(engine, served, restarts)
    app.add_middleware(CountRequests, metrics=metrics)  # added last, so outermost: it sees 401s too

    @app.exception_handler(RequestValidationError)
    async def _on_validation(_, exc):
        return validation_error(exc)

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

    def submit(body, prompt: list[int]) -> tuple[Request, asyncio.Queue]:
        """A request for the engine, queued; its events arrive on the returned asyncio queue."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        req = Request(prompt, limit_tokens(served, prompt, body), body.sampling(body.logprob_count() or 0),
                      emit=lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev), stop=body.stops())
        try:
            engine.submit(req)
        except QueueFull as e:
            raise ApiError(503, f"the server is busy ({e}); retry shortly", "server_overloaded", headers={"Retry-After": "1"}) from None
        except Unavailable as e:
            raise ApiError(503, f"the server is not taking requests: {e}", "service_unavailable", headers={"Retry-After": "5"}) from None
        return req, events

    def reserve(http: HttpRequest, body, prompt: list[int]) -> list | None:
        """The request's tokens (prompt + max_tokens) against its key's tokens per minute."""
        key = getattr(http.state, "key", None)
        if key is None:
            return None
        try:
            return reserve_tokens(key, len(prompt) + limit_tokens(served, prompt, body))
        except RateLimited as e:
            raise ApiError(429, str(e), e.kind, code="rate_limit_exceeded", headers={"Retry-After": str(e.retry_after)}) from None

    async def run(req: Request, events: asyncio.Queue, http: HttpRequest, reservation: list | None = None):
        """Yield the engine's events for `req`; marks it cancelled on exit (a no-op once finished)."""
        async def watch_disconnect():
            # The body is already read, so the next ASGI message is the client hanging up.
            while (await http.receive())["type"] != "http.disconnect":
                pass
            req.cancelled.set()

        watcher = asyncio.create_task(watch_disconnect())
        clock, ev = Clock(metrics), None
        try:
            while True:
                ev = await events.get()
                if isinstance(ev, Delta):
                    clock.tokens(len(ev.tokens))
                elif isinstance(ev, Done):
                    metrics.prompt_tokens.inc(ev.prompt_tokens)
                    metrics.completion_tokens.inc(ev.completion_tokens)
                    if reservation:
                        settle(reservation, ev.prompt_tokens + ev.completion_tokens)
                yield ev
                if isinstance(ev, (Done, Failed)):
                    return
        finally:
            if reservation and not isinstance(ev, Done):  # failed or cancelled: what it used is unknown
                settle(reservation, len(req.prompt))
            watcher.cancel()
            req.cancelled.set()  # frees the sequence on every rank if the client went away

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

    async def respond(body, prompt: list[int], http: HttpRequest, chat: bool):
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created, top = int(time.time()), body.logprob_count()
        obj = "chat.completion" if chat else "text_completion"
        reservation = reserve(http, body, prompt)  # before any byte is sent: a 429 is a plain answer
        try:
            req, events = submit(body, prompt)  # before any byte is sent, so a full queue is a plain 503
        except ApiError:
            if reservation:
                settle(reservation, 0)  # refused: it used nothing
            raise
        if body.stream:
            return StreamingResponse(stream(req, events, http, rid, created, top, chat, body, reservation),
                                     media_type="text/event-stream")
        text, tokens = [], []
        async for ev in run(req, events, http, reservation):
            if isinstance(ev, Delta):
                text.append(ev.text)
                tokens.extend(ev.tokens)
            elif isinstance(ev, Failed):
                raise ApiError(ev.status, ev.message, ev.type)
            else:
                done = ev
        content = "".join(text)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": chat_logprobs(tokens, top, token_text), "finish_reason": done.finish_reason}
        else:
            choice = {"index": 0, "text": content, "logprobs": completion_logprobs(tokens, top, token_text), "finish_reason": done.finish_reason}
        return {"id": rid, "object": obj, "created": created, "model": served.id, "choices": [choice], "usage": usage(done)}

    async def stream(req, events, http, rid, created, top, chat, body, reservation):
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta_or_text, finish=None, logprobs=None):
            choice = {"index": 0, "logprobs": logprobs, "finish_reason": finish}
            choice["delta" if chat else "text"] = delta_or_text
            return sse({"id": rid, "object": obj, "created": created, "model": served.id, "choices": [choice]})

        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        if chat:
            yield chunk({"role": "assistant", "content": ""})
        async for ev in run(req, events, http, reservation):
            if isinstance(ev, Delta):
                lp = chat_logprobs(ev.tokens, top, token_text) if chat else completion_logprobs(ev.tokens, top, token_text)
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
        check_model(served, body.model)
        check_sampling(served, body)
        prompt = await off_loop(chat_prompt, body)
        check_ids(served, "messages", prompt)  # a tokenizer may know ids (added tokens) the model has no row for
        return await respond(body, prompt, http, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: HttpRequest):
        check_model(served, body.model)
        check_sampling(served, body)
        prompt = body.prompt if isinstance(body.prompt, list) else await off_loop(encode, body.prompt)
        if not prompt:
            raise ApiError(400, "prompt: must be non-empty text or token ids", param="prompt")
        check_ids(served, "prompt", prompt)
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
        prefix = engine.sched.prefix
        cache = {"enabled": prefix is not None}
        if prefix is not None:  # ints the engine thread updates: read without a lock
            cache |= {"entries": len(prefix.entries), "tokens": prefix.held, "budget_tokens": prefix.budget,
                      "hits": prefix.hits, "hit_tokens": prefix.hit_tokens}
        return {"model": served.id, "plan": served.cluster["plan"], "ranks": ranks, "queued_requests": engine.requests.qsize(),
                "prompt_cache": cache}

    page = (Path(__file__).parent / "page.html").read_text()

    @app.get("/", include_in_schema=False)
    async def home():
        """The chat and the live ring, one self-contained page (nothing fetched from elsewhere)."""
        return HTMLResponse(page)

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics (text format 0.0.4)")
    async def prometheus():
        try:
            ranks = await on_engine(engine.status(), timeout=10)
        except Exception:  # the ring is down: rank 0's own figures still answer (and mlx_ring_up says 0)
            ranks = []
        return Response(metrics.render(ranks), media_type=CONTENT_TYPE_LATEST)

    app.openapi = lambda: document(app, served)
    return app


