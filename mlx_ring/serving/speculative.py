"""Speculative decoding on rank 0: draft tokens by prompt lookup, verify them all in one pass round
the ring, keep the prefix the target model agrees with.

A draft is a guess: verification samples every position from the target model's own distribution
(greedy: its argmax, so the output is token-identical to plain decoding; sampled: the standard
rejection rule, which for a drafter that proposes one token with certainty accepts it with the
target's probability and otherwise samples from the target with that token removed), so a wrong
draft costs compute, never correctness.
"""

from dataclasses import dataclass, field
from functools import partial
from typing import ClassVar

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from mlx_ring.cache.blocks import common_prefix
from mlx_ring.models.compat import UNFUSED_SEVERAL, unfused_attention
from mlx_ring.serving.sampling import (
    SequenceSampler,
    Token,
    attempt,
    read_rows,
    sample_rows,
    target_logits,
)

# A draft model guesses row by row, a forward per token, while a step costs about the same for any
# number of rows: in a larger group its guesses cost more than they can save, so it rests there
# (as vLLM's speculative decoding does past a batch size).
MODEL_DRAFT_ROWS = 4
NGRAMS = (3, 2)  # suffix lengths tried, longest first: a one-token match guesses too often wrong


@dataclass
class Drafter:
    """One sequence's draft length, adapted to how much of its drafts the target accepts: a full
    accept grows it, a partial one sets it just past what was accepted, and drafts that are all
    rejected pause drafting for twice as many steps each time (so a text the lookup cannot guess
    runs as plain decoding, at a cost of one step in many)."""

    # the pause after n drafts in a row all rejected: BACKOFF**n - 1 steps
    BACKOFF: ClassVar[int] = 2
    LONGEST: ClassVar[int] = 64  # pauses stop growing at LONGEST - 1 steps
    FIRST: ClassVar[int] = 16  # the most tokens a sequence's first draft may have (then `most`)

    most: int
    k: int = 0
    pause: int = 0  # steps to go without drafting
    misses: int = 0
    # Prompt lookup's index, grown with the history: n-gram -> where the tokens after its latest
    # occurrence start (a scan of a long prompt each step would cost rank 0 a millisecond a row).
    after: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed: int = 1  # n-grams ending before this position are in `after`
    earlier: set[int] = field(default_factory=set)  # the tokens of the history up to `counted`
    counted: int = 0

    def __post_init__(self):
        self.k = min(self.most, self.FIRST)

    def draft(self, history: list[int]) -> list[int]:
        if self.pause:
            self.pause -= 1
            return []
        drafts = self.propose(history)
        if not drafts:
            self.pause = 1  # the next step may then go out before this one's token is read
        return drafts

    def may_propose_next(self, history: list[int]) -> bool:
        """Whether a lookup one token from now can find anything, before that token is read:
        only if the history's last token occurred before it (every n-gram to match would
        start there). When it cannot, the next step goes out before this one's token is
        read, as without drafts."""
        self.earlier.update(history[self.counted : len(history) - 1])
        self.counted = max(self.counted, len(history) - 1)
        return history[-1] in self.earlier

    def propose(self, history: list[int]) -> list[int]:
        """Prompt lookup: the (up to) k tokens that followed the latest earlier occurrence of the
        history's last n tokens, for the longest n in NGRAMS that occurs; [] when none does."""
        # the tail itself (end == len) has nothing after it
        for end in range(self.indexed, len(history)):
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
        self.pause = self.pause_after(self.misses)

    def pause_after(self, misses: int) -> int:
        return min(self.BACKOFF**misses, self.LONGEST) - 1 if misses else 0


@dataclass
class Streak:
    """Draft cycles in a row, over every stream a draft model drafts for, that kept nothing."""

    misses: int = 0


@dataclass
class ModelDrafter(Drafter):
    """Drafts with a second, smaller model of the same vocabulary on rank 0 (`DRAFT_MODEL`),
    greedily, with a KV cache of its own per sequence that follows the sequence's history
    (trimmed back to what the history still shares with it, then fed the rest). Its guesses cost
    a forward a token and a row (and a catch-up after each pause: on CUDA a draft cycle costs
    several steps), so it starts short, backs off four times faster than prompt lookup and up to
    four times longer. How often a draft model agrees is a property of the pair of models more
    than of one text: a new stream starts from the misses in a row of the streams before it
    (`streak`), so a draft model that is never right costs a new stream one try in 256 steps, not
    four tries in its first 85."""

    BACKOFF: ClassVar[int] = 4
    LONGEST: ClassVar[int] = 256
    FIRST: ClassVar[int] = 2

    model: nn.Module | None = None
    streak: Streak = field(default_factory=Streak)
    cache: list = field(default_factory=list)
    fed: tuple[int, ...] = ()  # the tokens in `cache`

    def __post_init__(self):
        super().__post_init__()
        self.misses = self.streak.misses
        self.pause = self.pause_after(self.misses)

    def may_propose_next(self, history: list[int]) -> bool:
        return True  # a model always has a guess

    def update(self, drafted: int, accepted: int) -> None:
        super().update(drafted, accepted)
        if drafted:
            self.streak.misses = self.streak.misses + 1 if accepted == 0 else 0

    def propose(self, history: list[int]) -> list[int]:
        if not self.cache:
            self.cache = make_prompt_cache(self.model)
        seen = tuple(history)
        # the last token is fed again: its logits are needed
        kept = min(common_prefix(self.fed, seen), len(seen) - 1)
        for c in self.cache:
            c.trim(len(self.fed) - kept)
        new = history[kept:]
        if len(new) > 1:
            # Catching up (after a pause, or the prompt): the cache needs these tokens' keys and
            # values, not their logits; left lazy, the head never runs over them (the most of a
            # small model's cost). On CUDA, the fused kernel is compiled per key length: worth it
            # once for a prompt, not for every catch-up (plain attention's scores grow with the
            # tokens fed times the cache's).
            with unfused_attention(UNFUSED_SEVERAL and len(new) <= 256):
                self.model(mx.array([new[:-1]]), cache=self.cache)
        x, ids = mx.array([new[-1:]]), []
        for _ in range(self.k):  # built lazily, read once
            # (1, 1)
            x = mx.argmax(self.model(x, cache=self.cache)[:, -1, :], axis=-1, keepdims=True)
            ids.append(x)
        drafts = mx.concatenate(ids, axis=1)[0].tolist()
        self.fed = seen + tuple(drafts[:-1])  # the last draft was never fed
        return drafts


def verify(s: SequenceSampler, logits: mx.array, drafts: list[int]) -> list[Token]:
    """The tokens one row keeps from a verify pass: `logits (L, V)` are the target's at the row's
    input token and each draft (L > len(drafts)); returns the accepted drafts, then one token
    sampled where the first draft was rejected (or after the last). `s` accepts them all."""
    built = _build(s, logits, drafts)
    mx.eval(built)
    return _read(s, drafts, *built)


def _build(s: SequenceSampler, logits: mx.array, drafts: list[int]) -> tuple[mx.array, ...]:
    # Lazy: at each position, whether its draft is kept and the token sampled there if it is not
    # (after the last draft: the next token), with the log-probabilities of both.
    n = len(drafts)
    logprobs = logits[: n + 1] - mx.logsumexp(logits[: n + 1], axis=-1, keepdims=True)  # (n + 1, V)
    d = mx.array(drafts + [0], dtype=mx.int32)[:, None]  # (n + 1, 1); the last row has no draft
    if s.params.temperature == 0:
        picks = mx.argmax(logprobs, axis=-1)
        keep = picks[:n] == d[:n, 0]
    else:
        s.prepare(logits.shape[-1])
        key = s.step_key()
        k_keep, k_pick = mx.random.split(key) if key is not None else (None, None)
        target = target_logits(s, logprobs)
        p_draft = mx.exp(
            mx.take_along_axis(target, d, axis=-1) - mx.logsumexp(target, axis=-1, keepdims=True)
        )[:n, 0]
        keep = mx.random.uniform(shape=(n,), key=k_keep) < p_draft
        # Where draft j is rejected, the target with that token removed; after the last, the target.
        rows = mx.arange(n + 1)[:, None]
        picks = mx.random.categorical(
            mx.where((mx.arange(target.shape[-1])[None] == d) & (rows < n), -mx.inf, target),
            key=k_pick,
        )
    lp_picks = mx.take_along_axis(logprobs, picks[:, None], axis=-1)[:, 0]
    lp_drafts = mx.take_along_axis(logprobs, d, axis=-1)[:n, 0]
    return keep, picks, lp_picks, lp_drafts


def _read(s: SequenceSampler, drafts: list[int], keep, picks, lp_picks, lp_drafts) -> list[Token]:
    kept = next((j for j, k in enumerate(keep.tolist()) if not k), len(drafts))
    tokens = [Token(t, lp) for t, lp in zip(drafts[:kept], lp_drafts.tolist())]
    tokens.append(Token(picks[kept].item(), lp_picks[kept].item()))
    for t in tokens:
        s.accept(t.id)
    return tokens


def verify_rows(
    rows: list, logits: mx.array, drafts: list[list[int]]
) -> tuple[list[tuple], list[int], int]:
    """Apply a verify pass (`logits (B, 1 + width, V)`) to its rows (scheduler `Sequence`s): each
    keeps its accepted drafts and one more token (its sampler, `fed`, `last` and drafter updated).
    A row with no drafts (or whose processors read the history) samples at its first position, as
    plain decoding does. Returns the (row, token or the error its sampling raised) pairs in order,
    the positions each row's cache drops, and how many drafts were kept."""
    width = logits.shape[1] - 1
    drafting = [i for i, d in enumerate(drafts) if d]
    plain = [i for i, d in enumerate(drafts) if not d]
    built = [attempt(_build, rows[i].sampler, logits[i], drafts[i]) for i in drafting]
    outcome = dict(
        zip(
            drafting,
            read_rows(built, [partial(_read, rows[i].sampler, drafts[i]) for i in drafting]),
        )
    )
    if plain:
        firsts = sample_rows([rows[i].sampler for i in plain], logits[mx.array(plain), 0])
        outcome |= {i: t if isinstance(t, Exception) else [t] for i, t in zip(plain, firsts)}
    results, drops, accepted = [], [], 0
    for i, s in enumerate(rows):
        kept = outcome[i]
        if isinstance(kept, Exception):
            s.last = 0  # a failed row leaves before the next step
            drops.append(width)
            results.append((s, kept))
            continue
        s.fed += len(kept) - 1  # the input token was counted when the step went out
        s.last = kept[-1].id
        drops.append(width - (len(kept) - 1))
        if drafts[i]:
            s.drafter.update(len(drafts[i]), len(kept) - 1)
            accepted += len(kept) - 1
        results += [(s, t) for t in kept]
    return results, drops, accepted
