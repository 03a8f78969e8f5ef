"""`GET /metrics` in Prometheus' text format (prometheus_client), on rank 0.

Rank 0's HTTP figures are counted as they happen (requests, tokens, time to first token, inter-token
latency); the engine's (queue, prefills under way, ring steps, prompt cache, drafts) come from its
stats snapshot. Every rank's live figures (memory, KV cache, stage time, busy time) come from one
STATUS step round the ring per scrape, taken between generation steps, labelled `rank` and
`host`.
"""

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from mlx_ring.serving.port import STEP_BUCKETS, Stats

LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class RingMetrics:
    """The registry /metrics serves: rank 0's HTTP figures counted here as they happen, the engine's
    and every rank's figures given to `render` at each scrape."""

    def __init__(self, hosts: dict[int, str], restarts: int = 0, away: dict | None = None):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "mlx_ring_requests",
            "HTTP requests answered, by endpoint and status code",
            ["endpoint", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "mlx_ring_prompt_tokens", "prompt tokens of finished requests", registry=r
        )
        self.completion_tokens = Counter(
            "mlx_ring_completion_tokens", "completion tokens generated", registry=r
        )
        self.ttft = Histogram(
            "mlx_ring_time_to_first_token_seconds",
            "from a request's arrival to its first token",
            buckets=LATENCY,
            registry=r,
        )
        self.itl = Histogram(
            "mlx_ring_inter_token_latency_seconds",
            "time between a stream's tokens",
            buckets=LATENCY,
            registry=r,
        )
        Gauge(
            "mlx_ring_restarts", "times the launcher restarted the ring before this run", registry=r
        ).set(restarts)
        Gauge(
            "mlx_ring_hosts_away",
            "hosts the ring serves without, failed over (0: all of them serve)",
            registry=r,
        ).set(len(away["hosts"]) if away else 0)
        if away:
            Gauge(
                "mlx_ring_failed_over_since_seconds",
                "when the ring started serving without them (Unix time)",
                registry=r,
            ).set(away.get("since", 0))
        self.hosts = hosts
        self.stats: Stats | None = None
        self.ranks: list[dict] = []
        r.register(_Engine(self))
        r.register(_Ranks(self))

    def render(self, stats: Stats, ranks: list[dict]) -> bytes:
        """The text format, with the engine's snapshot and the ranks' rows (none when
        the ring is down)."""
        self.stats, self.ranks = stats, ranks
        return generate_latest(self.registry)


class _Engine:
    """Rank 0's engine figures from its latest snapshot."""

    def __init__(self, metrics: RingMetrics):
        self.m = metrics

    def describe(self):
        return []  # values exist only at scrape time

    def collect(self):
        s = self.m.stats
        if s is None:
            return
        yield GaugeMetricFamily(
            "mlx_ring_queue_depth", "requests waiting for a place", value=s.queued
        )
        yield GaugeMetricFamily("mlx_ring_active_sequences", "sequences generating", value=s.active)
        yield GaugeMetricFamily(
            "mlx_ring_waiting_prompts",
            "admitted sequences whose prompt has not started "
            "(a prefill turn, or room in the KV cache)",
            value=s.waiting,
        )
        yield GaugeMetricFamily(
            "mlx_ring_prefilling_prompts", "prompts prefilling now", value=len(s.prefills)
        )
        yield GaugeMetricFamily(
            "mlx_ring_prefill_tokens",
            "prompt tokens of the prompts prefilling now",
            value=sum(p.tokens for p in s.prefills),
        )
        yield GaugeMetricFamily(
            "mlx_ring_prefill_done_tokens",
            "of those, tokens in the KV cache so far (a start the prompt cache held included)",
            value=sum(p.done for p in s.prefills),
        )
        yield GaugeMetricFamily(
            "mlx_ring_up", "1 while the ring serves", value=0 if s.broken else 1
        )
        cumulative, buckets = 0, []
        for le, n in zip([*map(floatToGoString, STEP_BUCKETS), "+Inf"], s.step_counts):
            cumulative += n
            buckets.append((le, cumulative))
        yield HistogramMetricFamily(
            "mlx_ring_step_seconds",
            "one ring step on rank 0, waits on the other ranks included",
            buckets=buckets,
            sum_value=s.step_seconds,
        )
        if s.prompt_cache is not None:
            yield GaugeMetricFamily(
                "mlx_ring_prompt_cache_hit_tokens",
                "prompt tokens not prefilled thanks to the prompt cache, since the start",
                value=s.prompt_cache.hit_tokens,
            )
            yield GaugeMetricFamily(
                "mlx_ring_prompt_cache_tokens",
                "tokens held in the prompt cache's RAM tier (on every rank, for its own layers)",
                value=s.prompt_cache.tokens,
            )
            yield GaugeMetricFamily(
                "mlx_ring_prompt_cache_disk_hit_tokens",
                "of the hit tokens, those read back from the ranks' disks, since the start",
                value=s.prompt_cache.disk_hit_tokens,
            )
        if s.draft_tokens:
            yield GaugeMetricFamily(
                "mlx_ring_draft_tokens",
                "draft tokens verified by the target model, since the start",
                value=s.drafted,
            )
            yield GaugeMetricFamily(
                "mlx_ring_draft_tokens_accepted",
                "draft tokens the target model kept, since the start",
                value=s.accepted,
            )


class _Ranks:
    """Per-rank gauges from the latest STATUS step."""

    def __init__(self, metrics: RingMetrics):
        self.m = metrics

    def describe(self):
        return []  # values exist only at scrape time

    def collect(self):
        labels = ["rank", "host"]
        fams = {
            "mem": GaugeMetricFamily(
                "mlx_ring_rank_memory_bytes",
                "memory per rank: MLX active, MLX peak, process RSS",
                labels=[*labels, "kind"],
            ),
            "kv": GaugeMetricFamily(
                "mlx_ring_rank_kv_cache_bytes", "bytes the rank's KV caches hold", labels=labels
            ),
            "stage": GaugeMetricFamily(
                "mlx_ring_rank_stage_seconds",
                "moving average of a forward step on the rank (workers)",
                labels=labels,
            ),
            "seqs": GaugeMetricFamily(
                "mlx_ring_rank_open_sequences", "sequence rows cached on the rank", labels=labels
            ),
            "saved": GaugeMetricFamily(
                "mlx_ring_rank_prompt_cache_bytes",
                "bytes of the prompt cache the rank holds for its layers",
                labels=labels,
            ),
            "disk": GaugeMetricFamily(
                "mlx_ring_rank_prompt_disk_bytes",
                "bytes of prompt-cache blocks the rank holds on its own disk",
                labels=labels,
            ),
            "written": CounterMetricFamily(
                "mlx_ring_rank_prompt_disk_written_bytes",
                "bytes the rank wrote to its disk tier since it started (wear)",
                labels=labels,
            ),
            "prefill": CounterMetricFamily(
                "mlx_ring_rank_prefill_tokens",
                "token positions the rank ran prefill steps on",
                labels=labels,
            ),
            "busy": CounterMetricFamily(
                "mlx_ring_rank_busy_seconds",
                "time the rank spent running steps (rate() of it is the busy fraction; rank 0's "
                "includes its waits on the others)",
                labels=labels,
            ),
        }
        for row in self.m.ranks:
            who = [str(row["rank"]), self.m.hosts.get(row["rank"], "")]
            for kind, key in (
                ("active", "mlx_active_memory_kib"),
                ("peak", "mlx_peak_memory_kib"),
                ("rss", "rss_kib"),
            ):
                fams["mem"].add_metric([*who, kind], row[key] * 1024)
            fams["kv"].add_metric(who, row["kv_cache_kib"] * 1024)
            fams["stage"].add_metric(who, row["forward_us"] / 1e6)
            fams["seqs"].add_metric(who, row["open_sequences"])
            fams["busy"].add_metric(who, row["busy_cs"] / 100)
            fams["saved"].add_metric(who, row["prompt_cache_kib"] * 1024)
            fams["prefill"].add_metric(who, row["prefill_tokens"])
            fams["disk"].add_metric(who, row.get("disk_kib", 0) * 1024)
            fams["written"].add_metric(who, row.get("disk_written_kib", 0) * 1024)
        yield from fams.values()


class Clock:
    """A stream's token times: the first against its arrival, the others against the one before."""

    def __init__(self, metrics: RingMetrics):
        self.m, self.t0, self.last = metrics, time.perf_counter(), None

    def tokens(self, n: int) -> None:
        now = time.perf_counter()
        if self.last is None:
            self.m.ttft.observe(now - self.t0)
        elif n:
            # a delta may carry several tokens (held back by a stop string): share the gap
            for _ in range(n):
                self.m.itl.observe((now - self.last) / n)
        self.last = now


class CountRequests:
    """ASGI middleware: every answered request by its route as the app declares it (`/v1/messages`,
    `/v1/responses/{response_id}`; `other`: no route matched) and by status code."""

    def __init__(self, app, metrics: RingMetrics, routes: list):
        self.app, self.m = app, metrics
        self.routes = [(r.path_regex, r.path_format) for r in routes if hasattr(r, "path_regex")]

    def endpoint(self, path: str) -> str:
        """The route `path` reaches, named by its template: a bounded set of labels,
        whatever the paths sent."""
        return next((name for regex, name in self.routes if regex.match(path)), "other")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        endpoint = self.endpoint(scope["path"])

        async def counted(message):
            if message["type"] == "http.response.start":
                self.m.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)
