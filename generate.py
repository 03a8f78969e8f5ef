"""Rank 0's handle on the ring and the sampling of tokens from logits.

`Pipeline` is the only code that starts work on the ring. It keeps several steps in flight so that
rank 0 computes its stage of the next step while the other ranks compute theirs; how many, it
decides so that the ring can never deadlock (see `Pipeline.limit`). `SequenceSampler` turns one
sequence's logits into a token with mlx-lm's samplers and logits processors.
"""

import secrets
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from shard import STATUS_COLS, Header, Kind, Ring, Shard


class RingError(RuntimeError):
    """The ring is broken (a peer died or answered out of step); only a restart mends it."""


class Pipeline:
    """Submit steps (rank 0 applies its own stage at once), collect them as they come home, in order."""

    def __init__(self, shard: Shard, ring: Ring):
        assert ring.rank == 0, "only rank 0 drives the ring"
        self.shard, self.ring = shard, ring
        # Every rank alternates one blocking recv and one blocking send. With at most N-1 steps on the
        # ring when rank 0 sends, some rank is always receiving, so no cycle of blocked sends can form.
        self.limit = max(1, ring.size - 1)
        self.inflight: deque[Header] = deque()  # sent, not yet back
        self.ready: deque[tuple[Header, mx.array | None, bool]] = deque()  # applied here, not yet sent (alone: done)
        self.busy_since: float | None = None  # when the wait on the ring now running started; read by the watchdog
        # A DECODE step's payload, received lazily and not yet read off the socket. Rank 0 sends
        # nothing before reading it: the last rank may be blocked sending it (when it does not fit
        # the sockets' buffers) while rank 0 blocks sending to rank 1, and the ring would deadlock.
        self.unread: mx.array | None = None

    def can_submit(self) -> bool:
        return not self.ready if self.ring.size > 1 else True

    def outstanding(self) -> int:
        return len(self.inflight) + len(self.ready)

    def submit(self, header: Header, payload: mx.array | None, chained: bool = False) -> None:
        """Apply `header` on rank 0; it goes on round the ring as soon as the ring has room.
        `chained`: the step is built on the last DECODE payload, still unread (a group's next step
        built on the tokens just sampled from it)."""
        assert self.can_submit()
        out = self.shard.apply(header, payload)
        if self.ring.size == 1:
            if out is not None:
                mx.async_eval(out)  # alone: runs while the caller reads the previous step's tokens
        elif self.ready or len(self.inflight) >= self.limit:
            if out is not None:
                self.settle()  # the stage may be built on the last payload: read it, timed, first
                mx.eval(out)  # no room on the ring: compute rank 0's stage now, while the others work
        # else the send below computes it: its header leaves first, so the next rank builds its own
        # graph while this stage still computes.
        self.ready.append((header, out, chained))
        self._send_ready()

    def prefetch(self, *arrays: mx.array) -> None:
        """Start computing `arrays`, which the caller reads after submitting a step built on them.
        On a ring, that step's send computes them; alone, they would sit in the step's own graph and
        be read only when the whole step is done (the GPU idle while rank 0 handles their tokens)."""
        if self.ring.size == 1:
            mx.async_eval(*arrays)

    def settle(self) -> None:
        """Read the last DECODE payload off the socket, if that is still to do."""
        if self.unread is not None:
            try:
                with self.watching():  # waits on the last rank, so the watchdog times it
                    self.ring.wait_payload()
                    mx.eval(self.unread)
            except RuntimeError as e:  # MLX's ring backend reports a lost peer this way
                raise RingError(f"ring step DECODE failed: {e}") from e
            self.unread = None

    @contextmanager
    def watching(self):
        """Mark a wait on the other ranks, for the watchdog (nests). Rank 0's own compute stays
        outside: a slow local stage is not a hung peer."""
        outer = self.busy_since
        self.busy_since = outer or time.monotonic()
        try:
            yield
        finally:
            self.busy_since = outer

    def collect(self) -> tuple[Header, mx.array | None]:
        """The oldest outstanding step, back from the last rank. A DECODE step's payload comes back
        unevaluated: the caller builds on it (head, sampling, the next step) while it arrives, and
        calls `settle()` before it reads anything built on it; sending and collecting settle it."""
        if self.ring.size == 1:
            return self.ready.popleft()[:2]
        self.settle()
        if not self.inflight:
            self._send_ready()
        expected = self.inflight.popleft()
        lazy = expected.kind == Kind.DECODE
        try:
            with self.watching():
                # the ring closes: rank N-1 hands the step back to rank 0
                back, out = self.ring.recv(lazy=lazy)
        except RuntimeError as e:  # MLX's ring backend reports a lost peer this way
            raise RingError(f"ring step {Kind(expected.kind).name} failed: {e}") from e
        if not back.same_step(expected):
            raise RingError(f"ring returned {back}, sent {expected}: the ranks are out of step")
        if lazy:
            self.unread = out
        else:
            self._send_ready()  # the ring has room again: keep it busy before rank 0 looks at the result
        return back, out

    def _send_ready(self) -> None:
        while self.ring.size > 1 and self.ready and len(self.inflight) < self.limit:
            header, out, chained = self.ready.popleft()
            try:
                with self.watching():
                    # the header first, so rank 1 builds its graph while rank 0 computes its stage
                    self.ring.send_header(header, out)
                if chained and self.unread is not None:
                    # One graph reads the last payload, computes rank 0's stage on it and sends it
                    # (each sync costs a GPU decode step time); a decode stage takes milliseconds,
                    # so the watchdog may count it with the wait.
                    with self.watching():
                        self.ring.send_payload(out)
                    self.unread = None
                else:
                    self.settle()  # nothing else goes out before that payload is read
                    if out is not None:
                        mx.eval(out)  # rank 0's own stage: not a wait on the others, so not watched
                    with self.watching():
                        self.ring.send_payload(out)  # hand the step's payload to rank 1
            except RingError:
                raise
            except RuntimeError as e:
                raise RingError(f"ring step {Kind(header.kind).name} failed: {e}") from e
            self.inflight.append(header)

    def round_trip(self, header: Header, payload: mx.array | None = None) -> mx.array | None:
        """One step through every rank with nothing else outstanding (tests, shutdown)."""
        assert not self.outstanding()
        self.submit(header, payload)
        return self.collect()[1]

    def shutdown(self) -> None:
        while self.outstanding():
            self.collect()
        self.round_trip(Header(Kind.SHUTDOWN))


def status_table(size: int) -> mx.array:
    return mx.zeros((size, STATUS_COLS), dtype=mx.int32)


def parse_status(table: mx.array) -> list[dict]:
    keys = ("rank", "mlx_active_memory_kib", "mlx_peak_memory_kib", "rss_kib", "open_sequences",
            "cached_tokens", "forward_us", "kv_cache_kib", "kv_cache_peak_kib")
    return [dict(zip(keys, row)) for row in table.tolist()]


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

    def plain(self) -> bool:
        """No processors, no seed, no alternatives: rows with equal plain params sample in one call."""
        return not (self.repetition_penalty or self.presence_penalty or self.frequency_penalty
                    or self.logit_bias or self.seed is not None or self.top_logprobs)


@dataclass
class Token:
    id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


class SequenceSampler:
    """One sequence's sampler, logits processors and token history."""

    def __init__(self, params: SamplingParams, prompt: list[int]):
        self.params = params
        self.sampler = make_sampler(params.temperature, params.top_p, params.min_p, top_k=params.top_k)
        self.processors = make_logits_processors(
            params.logit_bias, params.repetition_penalty, 64, params.presence_penalty, 64, params.frequency_penalty, 64
        )
        self.history = list(prompt)
        self.step = 0

    def logprobs(self, logits: mx.array) -> mx.array:
        """Processed, normalised log-probabilities `(1, V)` from raw logits `(1, V)`."""
        bias = self.params.logit_bias or {}
        if bias and not 0 <= min(bias) <= max(bias) < logits.shape[-1]:
            # MLX's scatter does not check bounds: such an id would crash the process, not fail.
            raise ValueError(f"logit_bias names token ids outside the vocabulary [0, {logits.shape[-1]})")
        if self.processors:
            context = mx.array(self.history)
            for p in self.processors:
                logits = p(context, logits)
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    def sample(self, logprobs: mx.array) -> mx.array:
        if self.params.top_k >= logprobs.shape[-1]:  # mlx-lm's check raises inside a compiled function
            raise ValueError(f"top_k={self.params.top_k} must be below the vocabulary's {logprobs.shape[-1]} tokens")
        if self.params.seed is not None:
            # Per-request stream of randomness, independent of other requests sharing the ring.
            mx.random.seed((self.params.seed * 1_000_003 + self.step) % (1 << 63))
        return self.sampler(logprobs)

    def accept(self, token: int) -> None:
        self.history.append(token)
        self.step += 1


def sample_lazy(samplers: list[SequenceSampler], logits: mx.array) -> tuple[mx.array, mx.array] | None:
    """Rows that all share plain parameters sample in one batched call, left unevaluated, so the
    next step can be built on the ids before they are read: `(ids (B,), their logprobs (B,))`.
    None when some row needs its own processors or seed (or the batched call cannot be built:
    `sample_rows` then finds the row at fault)."""
    first = samplers[0].params
    if not (first.plain() and all(s.params == first for s in samplers)):
        return None
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    try:
        ids = samplers[0].sample(logprobs)
    except Exception as e:
        _heal(e)
        return None
    return ids, mx.take_along_axis(logprobs, ids[:, None], axis=-1)[:, 0]


def read_tokens(samplers: list[SequenceSampler], ids: mx.array, chosen: mx.array) -> list[Token]:
    """Materialise what `sample_lazy` built."""
    tokens = [Token(i, lp) for i, lp in zip(ids.tolist(), chosen.tolist())]
    for s, t in zip(samplers, tokens):
        s.accept(t.id)
    return tokens


def sample_rows(samplers: list[SequenceSampler], logits: mx.array) -> list[Token | Exception]:
    """One token per row of `logits (B, V)`, or the error that sampling that row raised: one
    request's settings that fail fail that request alone."""
    lazy = sample_lazy(samplers, logits)
    if lazy is not None:
        return read_tokens(samplers, *lazy)
    rows = [_try(_build_row, s, logits[e : e + 1]) for e, s in enumerate(samplers)]
    try:
        mx.eval([r for r in rows if not isinstance(r, Exception)])
    except Exception:  # find the row at fault: each alone
        rows = [r if isinstance(r, Exception) else _try(_eval, r) for r in rows]
    return [r if isinstance(r, Exception) else _try(_read_row, s, *r) for s, r in zip(samplers, rows)]


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception as e:
        return _heal(e)


def _heal(e: Exception) -> Exception:
    # mlx-lm's samplers are compiled with MLX's random state as an output: one that raises while
    # traced leaves that state a placeholder, and every later sampling would fail. A new seed mends it.
    mx.random.seed(secrets.randbits(63))
    return e


def _build_row(s: SequenceSampler, logits: mx.array) -> tuple[mx.array, mx.array]:
    lp = s.logprobs(logits)
    return lp, s.sample(lp)


def _eval(row: tuple[mx.array, mx.array]) -> tuple[mx.array, mx.array]:
    mx.eval(row)
    return row


def _read_row(s: SequenceSampler, lp: mx.array, i: mx.array) -> Token:
    tid = i.item()
    top = []
    if s.params.top_logprobs:
        best = mx.argsort(-lp[0])[: s.params.top_logprobs]
        top = list(zip(best.tolist(), lp[0][best].tolist()))
    token = Token(tid, lp[0, tid].item(), top)
    s.accept(token.id)
    return token
