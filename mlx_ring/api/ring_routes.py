"""The ring's own routes: health, status, Prometheus metrics and the page that shows them. Each
reads the engine through its port: `ping()` for the ranks' live figures, `stats()` for rank 0's."""

import asyncio
import time
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from mlx_ring.api.errors import ApiError
from mlx_ring.api.metrics import RingMetrics
from mlx_ring.api.served import ServedModel
from mlx_ring.serving.port import EnginePort, Stats

PAGE = Path(__file__).parent / "page.html"
ANSWER_WITHIN = 10.0  # seconds a ping may take before the ring counts as not answering


def status_routes(
    engine: EnginePort, served: ServedModel, metrics: RingMetrics, away: dict | None = None
) -> APIRouter:
    """`away`: the hosts a failed-over ring serves without (RING_AWAY); /health and
    /cluster/status show it."""
    router = APIRouter()
    failed_over = {"failed_over": away} if away else {}

    async def ping() -> list[dict]:
        return await asyncio.wait_for(asyncio.wrap_future(engine.ping()), ANSWER_WITHIN)

    @router.get("/health")
    async def health():
        t0, stats = time.perf_counter(), engine.stats()
        if not stats.serving:
            return JSONResponse(
                {"status": "unavailable", "error": stats.broken or "shutting down"} | failed_over,
                status_code=503,
            )
        try:
            ranks = await ping()  # a real trip through every rank
        except Exception as e:
            return JSONResponse(
                {"status": "unhealthy", "error": str(e) or type(e).__name__} | failed_over,
                status_code=503,
            )
        return {
            "status": "ok",
            "ranks": len(ranks),
            "ring_round_trip_ms": round((time.perf_counter() - t0) * 1e3, 2),
        } | failed_over

    @router.get("/cluster/status")
    async def cluster_status():
        try:
            live = await ping()
        except Exception as e:
            raise ApiError(503, f"the ring did not answer: {e}", "server_error") from None
        cluster = served.cluster.to_json()
        ranks = [static | dyn for static, dyn in zip(cluster["ranks"], live)]
        return (
            {"model": served.id, "plan": cluster["plan"], "ranks": ranks}
            | engine_status(engine.stats())
            | failed_over
        )

    page = PAGE.read_text()

    @router.get("/", include_in_schema=False)
    async def home():
        """The chat and the live ring, one self-contained page (nothing fetched from elsewhere)."""
        return HTMLResponse(page)

    @router.get(
        "/metrics",
        response_class=PlainTextResponse,
        summary="Prometheus metrics (text format 0.0.4)",
    )
    async def prometheus():
        try:
            ranks = await ping()
        # the ring is down: rank 0's own figures still answer (and mlx_ring_up says 0)
        except Exception:
            ranks = []
        return Response(metrics.render(engine.stats(), ranks), media_type=CONTENT_TYPE_LATEST)

    return router


def engine_status(s: Stats) -> dict:
    """/cluster/status's view of rank 0's engine."""
    cache = {"enabled": s.prompt_cache is not None}
    if s.prompt_cache is not None:
        c = s.prompt_cache
        cache |= {
            "entries": c.entries,
            "tokens": c.tokens,
            "budget_tokens": c.budget_tokens,
            "hits": c.hits,
            "hit_tokens": c.hit_tokens,
            "block_tokens": c.block,
            "disk_hit_tokens": c.disk_hit_tokens,
        }
        if c.disk is not None:  # rank 0's own disk tier: each rank's is in its row
            cache["disk"] = {
                "blocks": c.disk["blocks"],
                "tokens": c.disk["blocks"] * c.block,
                "bytes": c.disk["bytes"],
                "cap_bytes": c.disk["cap_bytes"],
                "written_bytes": c.disk["written_bytes"],
                "writing": c.disk["writing"],
            }
    return {
        "queued_requests": s.queued,
        "waiting_prompts": s.waiting,
        # each prompt prefilling now: `done` of its `tokens` are in the KV cache
        "prefilling": [
            {"tokens": p.tokens, "done": p.done, "cached": p.cached} for p in s.prefills
        ],
        "prompt_cache": cache,
        "speculative": {
            "draft_tokens": s.draft_tokens,
            "drafted": s.drafted,
            "accepted": s.accepted,
        },
    }
