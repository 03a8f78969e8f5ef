"""Constrained decoding with llguidance: the served tokenizer as llguidance sees it, and the logits
processor that keeps one sequence's tokens inside its grammar (rank 0 only).

llguidance (rather than outlines-core or xgrammar): a small wheel with no torch, masks computed
lazily per step (no per-schema index over the vocabulary: a new schema's matcher takes about 2 ms
here), a JSON-schema compiler that names the keywords it cannot enforce, and Lark grammars that mix
literal text with JSON (a tool call inside its template's markers).
"""

import llguidance
import llguidance.hf
import mlx.core as mx
import numpy as np
from llguidance import LLMatcher
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

# Computed here: an array still to compute belongs to the stream of the thread that built it (this
# module's importer), which the engine's thread cannot evaluate on.
_BITS = mx.arange(32, dtype=mx.uint32)
mx.eval(_BITS)


class Grammars:
    """The served tokenizer as llguidance sees it (built once: 0.37 s for 49k tokens here), to
    check grammars on the HTTP side and to make per-sequence processors on the engine thread."""

    def __init__(self, tokenizer, n_vocab: int):
        eos = sorted(tokenizer.eos_token_ids)
        self.tokenizer = llguidance.hf.from_tokenizer(
            tokenizer._tokenizer, n_vocab=n_vocab, eos_token=eos
        )

    def check(self, grammar: str) -> str:
        """'' when the grammar can be enforced, else why not (the keyword,
        as llguidance names it)."""
        try:
            return LLMatcher.validate_grammar(grammar, self.tokenizer)
        except Exception as e:  # a grammar that does not even parse
            return str(e)

    def processor(self, grammar: str) -> "Constraint":
        return Constraint(
            LLMatcher(self.tokenizer, grammar, log_level=0), self.tokenizer.vocab_size
        )


class Constraint:
    """One sequence's grammar, applied to its logits: tokens it forbids get -inf. The mask for
    the next token is computed on the host as soon as the last token is read (`advance`), which is
    while the next step's forward runs, and goes into the next sampling's graph as it is."""

    def __init__(self, matcher: LLMatcher, vocab: int):
        self.matcher, self.error = matcher, ""
        self.mask = allocate_token_bitmask(1, vocab)
        self._fill()  # the first token's, after the prompt

    def advance(self, token: int) -> None:
        """`token` was sampled: the matcher takes it and computes the next mask."""
        if self.error:
            return
        try:
            if not self.matcher.consume_token(token):
                self.error = f"the output left its grammar: {self.matcher.get_error()}"
                return
            self._fill()
        except Exception as e:  # fails this sequence alone, at its next sampling
            self.error = f"constrained decoding failed: {e}"

    def _fill(self) -> None:
        fill_next_token_bitmask(self.matcher, self.mask)
        if self.matcher.is_error():
            self.error = f"constrained decoding failed: {self.matcher.get_error()}"

    def __call__(self, logits: mx.array) -> mx.array:
        """`logits (1, V)` masked; raises (before the step's graph is built) where the grammar
        failed."""
        if self.error:
            raise ValueError(self.error)
        return masked(logits, self.mask)


def masked(logits: mx.array, mask: np.ndarray) -> mx.array:
    """`logits (1, V)` with every token whose bit is clear in `mask (1, ceil(V'/32))` at -inf; ids
    past the mask (a model's padded vocabulary) are forbidden too."""
    V = logits.shape[-1]
    words = mx.array(mask).view(mx.uint32)  # (1, W)
    # (1, 32W) bits, low bit first
    allowed = ((words[..., None] >> _BITS) & 1).reshape(1, -1)[:, :V]
    if allowed.shape[-1] < V:
        allowed = mx.concatenate(
            [allowed, mx.zeros((1, V - allowed.shape[-1]), allowed.dtype)], axis=-1
        )
    return mx.where(allowed.astype(mx.bool_), logits, -mx.inf)
