"""One sequence's logits turned into a token with mlx-lm's samplers and logits processors. A step's
rows sample in one lazy graph, whatever each asks (penalties, a bias, a seed, alternatives, a
grammar), so the next step can be built on the ids before they are read; rows that share plain
settings sample in one batched call."""

import math
import secrets
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Callable

import mlx.core as mx
from mlx_lm.sample_utils import greedy_sampler, make_logits_processors

from mlx_ring.gpu import is_device_failure
from mlx_ring.serving.draws import Draw
from mlx_ring.serving.params import SamplingParams

# The tokens the penalties look back over (mlx-lm's processors read the last that many).
CONTEXT = 64


@dataclass
class Token:
    id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


class SequenceSampler:
    """One sequence's sampler, logits processors, grammar and token history."""

    def __init__(self, params: SamplingParams, prompt: list[int], constraint=None):
        self.params = params
        # mlx-lm's make_sampler, its settings arrays: a new value builds no kernels (draws.py)
        self.draw = Draw(params) if params.temperature > 0 else None
        self.sampler = self.draw if self.draw is not None else greedy_sampler
        # the draw with the row's own key (`step_key`)
        if params.seed is not None and params.temperature > 0:
            self.sampler = partial(_seeded_sample, self)
        self.processors = make_logits_processors(
            params.logit_bias,
            params.repetition_penalty,
            CONTEXT,
            params.presence_penalty,
            CONTEXT,
            params.frequency_penalty,
            CONTEXT,
        )
        # applied last: it masks what the processors left, so nothing it forbids comes back
        self.constraint = constraint
        self.history = list(prompt)
        # The history's last tokens as an MLX array, extended by each step's ids as built (not
        # read): the processors read it inside the step's graph.
        self.context = mx.array(prompt[-CONTEXT:], dtype=mx.int32) if self.processors else None
        # Every setting in one tuple (a dict as its items), compared and hashed without a call:
        # rows whose tuples are equal sample together.
        self.settings = tuple(
            tuple(sorted(v.items())) if isinstance(v, dict) else v
            for v in (getattr(params, f.name) for f in fields(params))
        )
        self.step = 0
        bias = params.logit_bias or {}
        # checked against the logits each step
        self.bias_ids = (min(bias), max(bias)) if bias else None

    def logprobs(self, logits: mx.array) -> mx.array:
        """Processed, normalised log-probabilities `(1, V)` from raw logits `(1, V)`."""
        if self.bias_ids and not 0 <= self.bias_ids[0] <= self.bias_ids[1] < logits.shape[-1]:
            # MLX's scatter does not check bounds: such an id would crash the process, not fail.
            raise ValueError(
                f"logit_bias names token ids outside the vocabulary [0, {logits.shape[-1]})"
            )
        for p in self.processors:
            logits = p(self.context, logits)
        if self.constraint is not None:
            logits = self.constraint(logits)
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    def sample(self, logprobs: mx.array) -> mx.array:
        self.prepare(logprobs.shape[-1])
        return self.sampler(logprobs)

    def prepare(self, vocab: int) -> None:
        """Check the settings against the vocabulary; before sampling (mlx-lm's checks raise
        inside compiled functions, which leaves MLX's random state broken: `_heal`)."""
        if self.params.top_k >= vocab:
            raise ValueError(
                f"top_k={self.params.top_k} must be below the vocabulary's {vocab} tokens"
            )
        if not 0 <= self.params.min_p <= 1:
            raise ValueError(f"min_p={self.params.min_p} must be within [0, 1]")

    def step_key(self) -> mx.array | None:
        """This step's random key, from the row's own seed and position alone, so that neither its
        neighbours nor retries change its draws; None for an unseeded row, which draws from MLX's
        global state (seeded from fresh entropy, and touched by no seeded row)."""
        if self.params.seed is None:
            return None
        return mx.random.key((self.params.seed * 1_000_003 + self.step) % (1 << 64))

    def accept(self, token: int, built: mx.array | None = None) -> None:
        """`token` is the row's next; `built`: the same as the array `(1,)` it was read from,
        which the processors' context takes without a copy from the host."""
        self.history.append(token)
        self.step += 1
        if self.context is not None:
            new = mx.array([token], dtype=mx.int32) if built is None else built.astype(mx.int32)
            self.context = mx.concatenate([self.context, new])[-CONTEXT:]
        if self.constraint is not None:
            self.constraint.advance(token)  # the next mask, computed while the next step runs


@dataclass
class Drawn:
    """A step's tokens as built, not yet read: `ids (B,)`; their log-probabilities `(B,)` (NaN
    for a row that reports none; None where no row does); the alternatives of each row that
    reports them (`(ids (n,), logprobs (n,))` by row); and the error of each row whose settings
    could not be built (its id 0: it leaves before its next step)."""

    ids: mx.array
    logprobs: mx.array | None = None
    top: dict[int, tuple[mx.array, mx.array]] = field(default_factory=dict)
    failed: dict[int, Exception] = field(default_factory=dict)

    def arrays(self) -> list[mx.array]:
        """Every array the tokens are read from."""
        alternatives = [a for top in self.top.values() for a in top]
        return [self.ids, *([] if self.logprobs is None else [self.logprobs]), *alternatives]


def sample_lazy(samplers: list[SequenceSampler], logits: mx.array) -> Drawn:
    """Every row of `logits (B, V)` sampled in one graph, left unevaluated, so the next step can
    be built on the ids before they are read. Rows that share plain settings sample in one call;
    a row with processors, a seed, alternatives or a grammar samples alone (its settings checked
    before its graph is built: one that fails fails that row alone)."""
    same: dict[tuple, list[int]] = {}
    for e, s in enumerate(samplers):
        same.setdefault(s.settings if s.params.plain() else ("alone", e), []).append(e)
    order, ids, logprobs, drawn = [], [], [], Drawn(mx.array([]))
    for rows in same.values():
        s, n = samplers[rows[0]], len(rows)
        whole = n == len(samplers)  # as the rows stand: no gather
        x = logits if whole else logits[rows[0] : rows[0] + 1] if n == 1 else logits[mx.array(rows)]
        built = attempt(_plain if s.params.plain() else _alone, s, x)
        if isinstance(built, Exception):
            drawn.failed |= {e: built for e in rows}
            built = (mx.zeros((n,), mx.uint32), None, None)
        order += rows
        ids.append(built[0])
        logprobs.append(built[1])
        if built[2] is not None:
            drawn.top[rows[0]] = built[2]
    if len(ids) == 1:
        drawn.ids, drawn.logprobs = ids[0], logprobs[0]
        return drawn
    back = [0] * len(order)  # where each row's id is in the parts' concatenation
    for at, e in enumerate(order):
        back[e] = at
    back = mx.array(back)
    drawn.ids = mx.concatenate(ids)[back]
    if any(lp is not None for lp in logprobs):
        filled = [mx.full(i.shape, math.nan) if lp is None else lp for i, lp in zip(ids, logprobs)]
        drawn.logprobs = mx.concatenate(filled)[back]
    return drawn


def _plain(s: SequenceSampler, logits: mx.array) -> tuple[mx.array, mx.array | None, None]:
    # Greedy picks, top-k and a temperature's draw do not change when every logit of a row moves by
    # the same amount; a report or top-p needs the normalised ones, which cost a pass over the row.
    p = s.params
    normalise = p.logprobs or 0 < p.top_p < 1.0
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True) if normalise else logits
    ids = s.sample(logprobs)
    if not p.logprobs:
        return ids, None, None
    return ids, mx.take_along_axis(logprobs, ids[:, None], axis=-1)[:, 0], None


def _alone(s: SequenceSampler, logits: mx.array) -> tuple[mx.array, mx.array, tuple | None]:
    lp = s.logprobs(logits)
    ids = s.sample(lp)
    chosen = mx.take_along_axis(lp, ids[:, None], axis=-1)[:, 0]
    return ids, chosen, best(lp[0], s.params.top_logprobs) if s.params.top_logprobs else None


def best(lp: mx.array, n: int) -> tuple[mx.array, mx.array]:
    """The `n` most likely ids of `lp (V,)` and their values, the likeliest first and equal ones
    by id (as a stable sort orders them), without sorting the vocabulary: the n-th value from a
    partition, those above it and the first ids at it, then ranked among themselves."""
    n = min(n, lp.shape[-1])
    at = mx.arange(lp.shape[-1])
    nth = mx.min(mx.take(lp, mx.argpartition(-lp, kth=n - 1)[:n]))
    above, level = lp > nth, lp == nth
    chosen = above | (level & (mx.cumsum(level) <= n - above.sum()))
    ids = mx.argpartition(mx.where(chosen, at, at + lp.shape[-1]), kth=n - 1)[:n]
    vals = mx.take(lp, ids)
    # each one's place: how many of the others come before it
    ahead = (vals[None] > vals[:, None]) | (
        (vals[None] == vals[:, None]) & (ids[None] < ids[:, None])
    )
    place = ahead.sum(axis=1)
    ids = mx.zeros_like(ids).at[place].add(ids)
    return ids, mx.take(lp, ids)


def read_tokens(samplers: list[SequenceSampler], drawn: Drawn) -> list[Token | Exception]:
    """Materialise what `sample_lazy` built (a logprob of NaN where none was asked for); each
    row's sampler accepts its token, a row that failed gets its error."""
    mx.eval(drawn.arrays())
    picked = drawn.ids.tolist()
    logprobs = drawn.logprobs.tolist() if drawn.logprobs is not None else [math.nan] * len(picked)
    tokens = []
    for e, (s, i, lp) in enumerate(zip(samplers, picked, logprobs)):
        if e in drawn.failed:
            tokens.append(drawn.failed[e])
            continue
        top = drawn.top.get(e)
        tokens.append(Token(i, lp, list(zip(*(a.tolist() for a in top))) if top else []))
        s.accept(i, drawn.ids[e : e + 1] if s.context is not None else None)
    return tokens


def sample_rows(samplers: list[SequenceSampler], logits: mx.array) -> list[Token | Exception]:
    """One token per row of `logits (B, V)`, or the error that building that row's sampling
    raised: one request's settings that fail fail that request alone."""
    return read_tokens(samplers, sample_lazy(samplers, logits))


def read_rows(built: list, readers: list[Callable]) -> list:
    """Evaluate rows' lazy arrays (`built`: a tuple a row, or the error building it
    raised) in one go, then read each row with its reader; a row that fails gets its error
    and the others go on."""
    try:
        mx.eval([b for b in built if not isinstance(b, Exception)])
    except Exception as e:  # find the row at fault: each alone
        if is_device_failure(e):  # no row's: it ends the rank
            raise
        built = [b if isinstance(b, Exception) else attempt(_eval, b) for b in built]
    return [b if isinstance(b, Exception) else attempt(read, *b) for read, b in zip(readers, built)]


def attempt(fn, *args):
    """`fn(*args)`, or the error it raised (MLX's random state mended after a
    failed compiled sampler)."""
    try:
        return fn(*args)
    except Exception as e:
        return _heal(e)


def _heal(e: Exception) -> Exception:
    # The GPU failed, not the row: it ends the rank (engine.py), before any row goes on.
    if is_device_failure(e):
        raise e
    # mlx-lm's samplers are compiled with MLX's random state as an output: one that raises
    # while traced leaves that state a placeholder, and every later sampling would fail. A
    # new seed mends it.
    mx.random.seed(secrets.randbits(63))
    return e


def target_logits(s: SequenceSampler, logprobs: mx.array) -> mx.array:
    """Logits `(L, V)` of the distribution `s` samples from (mlx-lm's `make_sampler` chain: top-p,
    min-p, top-k, then temperature), for positions `logprobs (L, V)`."""
    return s.draw.target(logprobs)


def _seeded_sample(s: SequenceSampler, logprobs: mx.array) -> mx.array:
    return mx.random.categorical(target_logits(s, logprobs), key=s.step_key())


def _eval(row: tuple[mx.array, ...]) -> tuple[mx.array, ...]:
    mx.eval(row)
    return row
