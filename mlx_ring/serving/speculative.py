"""Speculative decoding on rank 0: draft tokens by prompt lookup, verify them all in one pass round
the ring, keep the prefix the target model agrees with.

A draft is a guess: verification samples every position from the target model's own distribution
(greedy: its argmax, so the output is token-identical to plain decoding; sampled: the standard
rejection rule, which for a drafter that proposes one token with certainty accepts it with the
target's probability and otherwise samples from the target with that token removed), so a wrong
draft costs compute, never correctness.
"""

from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from mlx_ring.serving.prefix import common_prefix
from mlx_ring.serving.sampling import SequenceSampler, Token, sample_rows

NGRAMS = (3, 2)  # suffix lengths tried, longest first: a one-token match guesses too often wrong


def lookup(history: list[int], k: int) -> list[int]:
    """Prompt lookup: the (up to) k tokens that followed the latest earlier occurrence of the
    history's last n tokens, for the longest n in NGRAMS that occurs; [] when none does."""
    for n in NGRAMS:
        if len(history) <= n:
            continue
        tail = history[-n:]
        for i in range(len(history) - n - 1, -1, -1):
            if history[i : i + n] == tail:
                return history[i + n : i + n + k]
    return []


@dataclass
class Drafter:
    """One sequence's draft length, adapted to how much of its drafts the target accepts: a full
    accept grows it, a partial one sets it just past what was accepted, and drafts that are all
    rejected pause drafting for twice as many steps each time (so a text the lookup cannot guess
    runs as plain decoding, at a cost of one step in many)."""

    most: int
    k: int = 0
    pause: int = 0  # steps to go without drafting
    misses: int = 0
    # Prompt lookup's index, grown with the history: n-gram -> where the tokens after its latest
    # occurrence start (a scan of a long prompt each step would cost rank 0 a millisecond a row).
    after: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed: int = 1  # n-grams ending before this position are in `after`

    def __post_init__(self):
        self.k = self.most

    def draft(self, history: list[int]) -> list[int]:
        if self.pause:
            self.pause -= 1
            return []
        drafts = self.propose(history)
        if not drafts:
            self.pause = 1  # the next step may then go out before this one's token is read
        return drafts

    def propose(self, history: list[int]) -> list[int]:
        """`lookup(history, self.k)`, from the index."""
        for end in range(self.indexed, len(history)):  # the tail itself (end == len) has nothing after it
            for n in NGRAMS:
                if end >= n:
                    self.after[tuple(history[end - n : end])] = end
        self.indexed = max(self.indexed, len(history))
        for n in NGRAMS:
            start = self.after.get(tuple(history[-n:])) if len(history) > n else None
            if start is not None:
                return history[start : start + self.k]
        return []

    def skip(self) -> None:
        """A step went without drafts for this sequence."""
        self.pause = max(0, self.pause - 1)

    def update(self, drafted: int, accepted: int) -> None:
        if not drafted:
            return
        self.k = min(self.most, self.k + 2) if accepted == drafted else max(1, accepted + 1)
        self.misses = self.misses + 1 if accepted == 0 else 0
        self.pause = min(2**self.misses, 64) - 1 if self.misses else 0


@dataclass
class ModelDrafter(Drafter):
    """Drafts with a second, smaller model of the same vocabulary on rank 0 (`DRAFT_MODEL`), greedily,
    with a KV cache of its own per sequence that follows the sequence's history (trimmed back to
    what the history still shares with it, then fed the rest)."""

    model: nn.Module | None = None
    cache: list = field(default_factory=list)
    fed: tuple[int, ...] = ()  # the tokens in `cache`

    def propose(self, history: list[int]) -> list[int]:
        if not self.cache:
            self.cache = make_prompt_cache(self.model)
        seen = tuple(history)
        kept = min(common_prefix(self.fed, seen), len(seen) - 1)  # the last token is fed again: its logits are needed
        for c in self.cache:
            c.trim(len(self.fed) - kept)
        x, ids = mx.array([history[kept:]]), []
        for _ in range(self.k):  # built lazily, read once
            x = mx.argmax(self.model(x, cache=self.cache)[:, -1, :], axis=-1, keepdims=True)  # (1, 1)
            ids.append(x)
        drafts = mx.concatenate(ids, axis=1)[0].tolist()
        self.fed = seen + tuple(drafts[:-1])  # the last draft was never fed
        return drafts


def target_logits(s: SequenceSampler, logprobs: mx.array) -> mx.array:
    """Logits `(L, V)` of the distribution `s` samples from (mlx-lm's `make_sampler` chain: top-p,
    min-p, top-k, then temperature), for positions `logprobs (L, V)`."""
    p = s.params
    if 0 < p.top_p < 1.0:
        logprobs = apply_top_p(logprobs, p.top_p)
    if p.min_p != 0.0:
        logprobs = apply_min_p(logprobs, p.min_p)
    if p.top_k > 0:
        logprobs = apply_top_k(logprobs, p.top_k)
    return logprobs * (1.0 / p.temperature)


def verify(s: SequenceSampler, logits: mx.array, drafts: list[int]) -> list[Token]:
    """The tokens one row keeps from a verify pass: `logits (L, V)` are the target's at the row's
    input token and each draft (L > len(drafts)); returns the accepted drafts, then one token sampled
    where the first draft was rejected (or after the last). `s` accepts them all."""
    n = len(drafts)
    logprobs = logits[: n + 1] - mx.logsumexp(logits[: n + 1], axis=-1, keepdims=True)  # (n + 1, V)
    if s.params.temperature == 0:
        best = mx.argmax(logprobs, axis=-1)
        picks = best.tolist()
        kept = next((j for j in range(n) if picks[j] != drafts[j]), n)
        ids = drafts[:kept] + [picks[kept]]
    else:
        if s.params.seed is not None:
            mx.random.seed((s.params.seed * 1_000_003 + s.step) % (1 << 63))
        target = target_logits(s, logprobs)
        d = mx.array(drafts + [0], dtype=mx.int32)[:, None]  # (n + 1, 1); the last row has no draft
        p_draft = mx.exp(mx.take_along_axis(target, d, axis=-1) - mx.logsumexp(target, axis=-1, keepdims=True))[:, 0]
        coin = mx.random.uniform(shape=(n + 1,))
        rows = mx.arange(n + 1)[:, None]
        # Where draft j is rejected, the target with that token removed; after the last, the target.
        residual = mx.where((mx.arange(target.shape[-1])[None] == d) & (rows < n), -mx.inf, target)
        sampled = mx.random.categorical(residual)
        accept, sampled = (coin < p_draft).tolist(), sampled.tolist()
        kept = next((j for j in range(n) if not accept[j]), n)
        ids = drafts[:kept] + [sampled[kept]]
    chosen = logprobs[mx.arange(len(ids)), mx.array(ids)].tolist()
    tokens = [Token(i, lp) for i, lp in zip(ids, chosen)]
    for t in tokens:
        s.accept(t.id)
    return tokens


def verify_rows(samplers: list[SequenceSampler], logits: mx.array, drafts: list[list[int]]) -> list[list[Token] | Exception]:
    """Each row's tokens from a verify pass (`logits (B, L, V)`), or the error its sampling raised.
    A row with no drafts (or one whose processors read the history) samples at its first position
    alone, as plain decoding does."""
    out = []
    for i, (s, d) in enumerate(zip(samplers, drafts)):
        if d:
            try:
                out.append(verify(s, logits[i], d))
            except Exception as e:
                out.append(e)
        else:
            t = sample_rows([s], logits[i : i + 1, 0])[0]
            out.append(t if isinstance(t, Exception) else [t])
    return out
