"""Decoding on rank 0 as small pieces: one trip round the ring, prefill, step, generate.

`Pipeline` is the only code that starts work on the ring; `generate` is a generator, so the caller
(the scheduler) decides when a sequence stops.
"""

import time
from dataclasses import dataclass, field
from typing import Iterator

import mlx.core as mx
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from shard import STATUS_COLS, Header, Kind, Ring, Shard


class RingError(RuntimeError):
    """The ring is broken (a peer died or answered out of step); only a restart mends it."""


class Pipeline:
    """Rank 0's handle on the whole ring: embed, every rank's layers in turn, head."""

    def __init__(self, shard: Shard, ring: Ring):
        assert ring.rank == 0, "only rank 0 drives the ring"
        self.shard, self.ring = shard, ring
        self.busy_since: float | None = None  # when the step now on the ring started; read by the watchdog

    def round_trip(self, header: Header, payload: mx.array | None) -> mx.array | None:
        """Apply a step on rank 0, then on ranks 1..N-1 in ring order; returns what comes home."""
        self.busy_since = time.monotonic()
        try:
            out = self.shard.apply(header, payload)
            if self.ring.size == 1:
                return out
            self.ring.send(header, out)  # hand the step to rank 1
            back, out = self.ring.recv()  # the ring closes: rank N-1 hands it back to rank 0
        except RuntimeError as e:  # MLX's ring backend reports a lost peer this way
            raise RingError(f"ring step {Kind(header.kind).name} failed: {e}") from e
        finally:
            self.busy_since = None
        if back != header:
            raise RingError(f"ring returned {back}, sent {header}: the ranks are out of step")
        return out

    def logits(self, seq: int, tokens: list[int], offset: int) -> mx.array:
        """Logits `(V,)` at the last of `tokens`, appended to the cache of `seq` holding `offset` tokens."""
        h = self.shard.embed(mx.array([tokens]))  # (1, L, H)
        h = self.round_trip(Header.for_payload(Kind.FORWARD, h, seq, offset), h)
        return self.shard.head(h[:, -1:, :])[0, -1]

    def free(self, seq: int) -> None:
        self.round_trip(Header(Kind.FREE, seq), None)

    def ping(self) -> None:
        self.round_trip(Header(Kind.PING), None)

    def status(self) -> list[dict]:
        table = mx.zeros((self.ring.size, STATUS_COLS), dtype=mx.int32)
        rows = self.round_trip(Header.for_payload(Kind.STATUS, table), table).tolist()
        keys = ("rank", "mlx_active_memory_kib", "mlx_peak_memory_kib", "rss_kib", "open_sequences", "cached_tokens")
        return [dict(zip(keys, row)) for row in rows]

    def shutdown(self) -> None:
        self.round_trip(Header(Kind.SHUTDOWN), None)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    top_logprobs: int = 0  # how many alternatives to report per token (0: none)


@dataclass
class Token:
    id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def generate(pipe: Pipeline, seq: int, prompt: list[int], params: SamplingParams) -> Iterator[Token]:
    """Yield sampled tokens for `prompt` forever; the caller stops it (and frees `seq`)."""
    sampler = make_sampler(params.temperature, params.top_p, params.min_p, top_k=params.top_k)
    processors = make_logits_processors(
        params.logit_bias, params.repetition_penalty, 64, params.presence_penalty, 64, params.frequency_penalty, 64
    )
    history = list(prompt)
    logits = pipe.logits(seq, prompt, 0)  # prefill: the whole prompt in one step
    for step in range(1 << 62):
        if processors:
            context = mx.array(history)
            for p in processors:
                logits = p(context, logits[None])[0]
        logprobs = logits - mx.logsumexp(logits)
        if params.seed is not None:
            # Per-request stream of randomness, independent of other requests sharing the engine.
            mx.random.seed((params.seed * 1_000_003 + step) % (1 << 63))
        token = sampler(logprobs[None])[0].item()
        top = []
        if params.top_logprobs:
            ids = mx.argsort(-logprobs)[: params.top_logprobs]
            top = list(zip(ids.tolist(), logprobs[ids].tolist()))
        yield Token(token, logprobs[token].item(), top)
        history.append(token)
        logits = pipe.logits(seq, [token], len(history) - 1)
