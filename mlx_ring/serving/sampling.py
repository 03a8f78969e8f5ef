"""One sequence's logits turned into a token with mlx-lm's samplers and logits processors; rows
that share plain settings sample in one batched call."""

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


@dataclass
class Token:
    id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


class SequenceSampler:
    """One sequence's sampler, logits processors and token history."""

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
            64,
            params.presence_penalty,
            64,
            params.frequency_penalty,
            64,
        )
        # last: it masks what the others left, so nothing it forbids comes back
        if constraint is not None:
            self.processors.append(constraint)
        self.history = list(prompt)
        # Every setting in one tuple, compared without a call: rows whose tuples
        # are equal sample together.
        self.settings = tuple(getattr(params, f.name) for f in fields(params))
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
        if self.processors:
            context = mx.array(self.history)
            for p in self.processors:
                logits = p(context, logits)
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    def sample(self, logprobs: mx.array) -> mx.array:
        self.prepare(logprobs.shape[-1])
        return self.sampler(logprobs)

    def prepare(self, vocab: int) -> None:
        """Check the settings against the vocabulary; before sampling."""
        if self.params.top_k >= vocab:  # mlx-lm's check raises inside a compiled function
            raise ValueError(
                f"top_k={self.params.top_k} must be below the vocabulary's {vocab} tokens"
            )

    def step_key(self) -> mx.array | None:
        """This step's random key, from the row's own seed and position alone, so that neither its
        neighbours nor retries change its draws; None for an unseeded row, which draws from MLX's
        global state (seeded from fresh entropy, and touched by no seeded row)."""
        if self.params.seed is None:
            return None
        return mx.random.key((self.params.seed * 1_000_003 + self.step) % (1 << 64))

    def accept(self, token: int) -> None:
        self.history.append(token)
        self.step += 1


def sample_lazy(samplers: list[SequenceSampler], logits: mx.array) -> tuple[mx.array, ...] | None:
    """Rows that all share plain parameters sample in one batched call, left unevaluated, so the
    next step can be built on the ids before they are read: `(ids (B,), their logprobs (B,))`, or
    `(ids,)` where no logprob is asked for (no array, so nothing more to compute and read a step).
    None when some row needs its own processors or seed (or the batched call cannot be built:
    `sample_rows` then finds the row at fault)."""
    first, settings = samplers[0].params, samplers[0].settings
    if not (first.plain() and all(s.settings == settings for s in samplers)):
        return None
    # Greedy picks, top-k and a temperature's draw do not change when every logit of a row moves by
    # the same amount; a report or top-p needs the normalised ones, which cost a pass over the row.
    normalise = first.logprobs or 0 < first.top_p < 1.0
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True) if normalise else logits
    try:
        ids = samplers[0].sample(logprobs)
    except Exception as e:
        _heal(e)
        return None
    if not normalise:
        return (ids,)
    return ids, mx.take_along_axis(logprobs, ids[:, None], axis=-1)[:, 0]


def read_tokens(
    samplers: list[SequenceSampler], ids: mx.array, chosen: mx.array | None = None
) -> list[Token]:
    """Materialise what `sample_lazy` built (a logprob of NaN where none was asked for)."""
    picked = ids.tolist()
    logprobs = chosen.tolist() if chosen is not None else [math.nan] * len(picked)
    tokens = [Token(i, lp) for i, lp in zip(picked, logprobs)]
    for s, t in zip(samplers, tokens):
        s.accept(t.id)
    return tokens


def sample_rows(samplers: list[SequenceSampler], logits: mx.array) -> list[Token | Exception]:
    """One token per row of `logits (B, V)`, or the error that sampling that row raised: one
    request's settings that fail fail that request alone."""
    lazy = sample_lazy(samplers, logits)
    if lazy is not None:
        return read_tokens(samplers, *lazy)
    built = [attempt(_build_row, s, logits[e : e + 1]) for e, s in enumerate(samplers)]
    return read_rows(built, [partial(_read_row, s) for s in samplers])


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


def _build_row(s: SequenceSampler, logits: mx.array) -> tuple[mx.array, mx.array]:
    lp = s.logprobs(logits)
    return lp, s.sample(lp)


def _eval(row: tuple[mx.array, ...]) -> tuple[mx.array, ...]:
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
