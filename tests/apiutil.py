"""The HTTP app in process (FastAPI's TestClient) around a stand-in engine: the API's behaviours
without a ring. The real engine is covered end to end by the ring tests."""

import threading
import time
from concurrent.futures import Future
from dataclasses import replace

import httpx
from fastapi.testclient import TestClient
from mlx_lm.utils import load_config
from prometheus_client.parser import text_string_to_metric_families

from mlx_ring.api.app import make_app
from mlx_ring.api.served import ServedModel
from mlx_ring.models.shape import read_shape
from mlx_ring.planning.cluster import Cluster, PlanFacts, RankFacts
from mlx_ring.planning.sizes import parameter_count
from mlx_ring.ring.protocol import StatusRow
from mlx_ring.serving.grammar import Grammars
from mlx_ring.serving.port import (
    STEP_BUCKETS,
    Delta,
    Done,
    Failed,
    PromptCacheStats,
    Request,
    Started,
    Stats,
)
from mlx_ring.serving.sampling import Token
from mlx_ring.serving.textstream import TextStream

MODEL = "SmolLM2-135M-Instruct"
ANSWER = "The capital of France is Paris."
HOSTS = ["alpha", "beta"]
WEATHER = {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}
# the tools template's call
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def templated(served, messages, **kw) -> list[int]:
    """The prompt chat completions would send for `messages`."""
    return served.tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kw)


class FakeEngine:
    """Answers every request with the token ids of `answer` and then the end token, as the
    real engine ends text (mlx-lm's detokenizer, stop strings, max_tokens); `fail_after`
    tokens it fails the request with `failure` instead (0: before its prefill begins). Each
    token's logprob is -0.5, its alternatives the next ids. Every prompt's prefill begins at
    once (Started) and lasts until `hold` is set, where it is not None; `queued`: the prompt
    waits for its turn until then instead, its prefill not begun."""

    def __init__(self, tokenizer, answer: str = ANSWER):
        self.tokenizer = tokenizer
        self.answer = answer
        self.refuse: Exception | None = None  # raised by submit (QueueFull, Unavailable)
        self.fail_after: int | None = None
        self.failure = Failed("ring failure: a rank stopped", 503, "service_unavailable")
        self.ping_error: Exception | None = None  # the ring does not answer a ping
        self.submitted: list[list[Request]] = []
        self.cancelled: list[Request] = []
        self.emitted: list[list] = []  # every request's events, in order
        self.cached = 0  # prompt tokens each answer says the prompt cache held
        # seconds before each event, sent from a thread of its own (0: at once, in submit)
        self.pace = 0.0
        self.hold: threading.Event | None = None  # each answer on its own thread, after it is set
        self.queued = False
        self.snapshot = Stats(
            queued=0,
            active=0,
            broken=None,
            stopping=False,
            prompt_cache=PromptCacheStats(
                entries=2, tokens=300, budget_tokens=4000, hits=5, hit_tokens=120
            ),
            draft_tokens=0,
            drafted=0,
            accepted=0,
            step_counts=(0, 0, 3, 4, 0, 0, 0, 0, 0, 0, 0, 1, 2),
            step_seconds=12.5,
        )
        assert len(self.snapshot.step_counts) == len(STEP_BUCKETS) + 1

    # -- the port --------------------------------------------------------------------------------
    def submit(self, *reqs: Request) -> None:
        if self.refuse:
            raise self.refuse
        self.submitted.append(list(reqs))
        for r in reqs:
            if self.pace or self.hold:
                threading.Thread(target=self._answer, args=(r,), daemon=True).start()
            else:
                self._answer(r)

    def cancel(self, *reqs: Request) -> None:
        self.cancelled += reqs
        for r in reqs:
            r.cancelled.set()

    def stats(self) -> Stats:
        return self.snapshot

    def ping(self) -> Future:
        fut = Future()
        if self.ping_error:
            fut.set_exception(self.ping_error)
        else:
            fut.set_result([rank_row(r) for r in range(len(HOSTS))])
        return fut

    # -- answering -------------------------------------------------------------------------------
    def answer_ids(self) -> list[int]:
        return self.tokenizer.encode(self.answer, add_special_tokens=False)

    def _answer(self, r: Request) -> None:
        events = []
        self.emitted.append(events)

        def emit(ev):
            time.sleep(self.pace)
            # an answer on a thread of its own stops once the client has gone
            if (self.pace or self.hold) and r.cancelled.is_set():
                return
            events.append(ev)
            r.emit(ev)

        # a test that never sets `hold` fails on what it reads, not here
        if self.hold is not None and self.queued:
            self.hold.wait(60)
        if self.fail_after != 0:
            emit(Started(self.cached))
        if self.hold is not None and not self.queued:
            self.hold.wait(60)
        text, eos = TextStream(self.tokenizer.detokenizer, r.stop), self.tokenizer.eos_token_id
        for n, tid in enumerate([*self.answer_ids(), eos], 1):
            if self.fail_after is not None and n > self.fail_after:
                return emit(self.failure)
            token = Token(tid, -0.5, [(tid + k, -0.5 - k) for k in range(r.params.top_logprobs)])
            if tid == eos:  # the end token is counted but has no text, so no logprobs entry
                piece = text.end()
            else:
                piece = text.add(tid, token)
            if piece is not None:
                emit(Delta(piece.text, piece.tokens, self.cached))
            if tid == eos:
                return emit(Done("stop", len(r.prompt), n, self.cached))
            if not text.closed and n >= r.max_tokens:
                end = text.end()
                if end is not None:
                    emit(Delta(end.text, end.tokens, self.cached))
                if not text.stop_hit:
                    return emit(Done("length", len(r.prompt), n, self.cached))
            if text.closed:
                return emit(Done("stop", len(r.prompt), n, self.cached, text.stop_hit))


def rank_row(rank: int) -> dict:
    """A rank's live figures as a STATUS step brings them: every field set, each different."""
    names = list(StatusRow.__dataclass_fields__)
    return {
        name: (rank if name == "rank" else 1000 * (rank + 1) + i) for i, name in enumerate(names)
    }


def served_model(model, tokenizer) -> ServedModel:
    """The default model as server.py serves it on a ring of two."""
    config = load_config(model)
    vocab = config["vocab_size"]
    ranks = tuple(
        RankFacts(rank=r, host=h, layers=(15 * r, 15 * (r + 1)), parameter_bytes_kib=100_000 - r)
        for r, h in enumerate(HOSTS)
    )
    return ServedModel(
        id=MODEL,
        tokenizer=tokenizer,
        context_length=config["max_position_embeddings"],
        default_max_tokens=512,
        vocab_size=min(vocab, len(tokenizer.get_vocab())),
        cluster=Cluster(ranks, PlanFacts("balanced", 30, ((0, 15), (15, 30)))),
        grammars=Grammars(tokenizer, vocab),
        config=config,
        parameters=parameter_count(config),
        weights="float32",
        shape=read_shape(config),
    )


def client(
    engine: FakeEngine, served: ServedModel, keys=(), app_args: dict | None = None, **changes
) -> TestClient:
    """A client of the app in process; `app_args`: make_app's keyword arguments; `changes`:
    ServedModel fields to change."""
    return TestClient(
        make_app(
            engine,
            replace(served, **changes) if changes else served,
            list(keys),
            **(app_args or {}),
        )
    )


def samples(metrics_text: str) -> dict:
    """/metrics parsed by prometheus_client's own parser: {(name, sorted labels): value}."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(metrics_text)
        for s in fam.samples
    }


class Bridge(httpx.BaseTransport):
    """An httpx transport (for clients that build their own httpx.Client, as ollama's does)
    that carries each request through the in-process app's TestClient, which speaks
    starlette's httpx2, streaming."""

    def __init__(self, test_client: TestClient):
        self.tc = test_client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        sent = self.tc.build_request(
            request.method, str(request.url), headers=dict(request.headers), content=request.read()
        )
        r = self.tc.send(sent, stream=True)
        return httpx.Response(r.status_code, headers=r.headers.multi_items(), stream=_Body(r))


class _Body(httpx.SyncByteStream):
    def __init__(self, response):
        self.response = response

    def __iter__(self):
        yield from self.response.iter_raw()

    def close(self) -> None:
        self.response.close()
