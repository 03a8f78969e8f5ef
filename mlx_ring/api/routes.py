"""The OpenAI-compatible HTTP routes on rank 0 (FastAPI). They never touch MLX: they check a request
against the served model, tokenize it off the event loop, queue it for the engine thread, and turn
the engine's events into OpenAI responses."""

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from mlx_ring.api.answers import Answers
from mlx_ring.api.chat import output_grammar, template_messages, tool_calls
from mlx_ring.api.errors import ApiError, error_body, validation_error
from mlx_ring.api.keys import Key
from mlx_ring.api.metrics import CountRequests, RingMetrics
from mlx_ring.api.middleware import JsonBodies, KeyAuth
from mlx_ring.api.openapi import document
from mlx_ring.api.schema import ChatCompletionRequest, CompletionRequest
from mlx_ring.api.served import ServedModel, check_ids, check_model, check_sampling
from mlx_ring.serving.engine import Engine

log = logging.getLogger(__name__)


def make_app(engine: Engine, served: ServedModel, keys: list[Key] = (), restarts: int = 0) -> FastAPI:
    app = FastAPI(title="mlx-ring", description="One model split across a ring of MLX ranks, served as OpenAI.")
    app.add_middleware(JsonBodies)
    if keys:
        app.add_middleware(KeyAuth, keys=list(keys))
    metrics = RingMetrics(engine, served, restarts)
    answers = Answers(engine, served, metrics)
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

    def chat_prompt(body: ChatCompletionRequest) -> list[int]:
        tools = [t.model_dump(exclude_none=True) for t in body.offered_tools()]
        try:
            return served.tokenizer.apply_chat_template(template_messages(body.messages), add_generation_prompt=True,
                                                        tokenize=True, **({"tools": tools} if tools else {}))
        except Exception as e:
            raise ApiError(400, f"messages: cannot apply the chat template: {e}", param="messages") from None

    def encode(text: str) -> list[int]:
        try:
            return served.tokenizer.encode(text)
        except Exception as e:  # e.g. a lone surrogate escaped in the JSON
            raise ApiError(400, f"prompt: cannot be tokenized: {e}", param="prompt") from None

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, http: HttpRequest):
        check_model(served, body.model)
        check_sampling(served, body)
        tools = tool_calls(served, body)
        grammar = await off_loop(output_grammar, served, body)
        prompt = await off_loop(chat_prompt, body)
        check_ids(served, "messages", prompt)  # a tokenizer may know ids (added tokens) the model has no row for
        return await answers.respond(body, prompt, http, chat=True, grammar=grammar, tools=tools)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: HttpRequest):
        check_model(served, body.model)
        check_sampling(served, body)
        prompt = body.prompt if isinstance(body.prompt, list) else await off_loop(encode, body.prompt)
        if not prompt:
            raise ApiError(400, "prompt: must be non-empty text or token ids", param="prompt")
        check_ids(served, "prompt", prompt)
        return await answers.respond(body, prompt, http, chat=False)

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
        sched = engine.sched
        speculative = {"draft_tokens": sched.draft_tokens, "drafted": sched.drafted, "accepted": sched.accepted}
        return {"model": served.id, "plan": served.cluster["plan"], "ranks": ranks, "queued_requests": engine.requests.qsize(),
                "prompt_cache": cache, "speculative": speculative}

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


