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
    """One sequence's grammar as an mlx-lm logits processor: tokens it forbids get -inf. It reads
    the tokens sampled since its last call from the history mlx-lm passes it."""

    def __init__(self, matcher: LLMatcher, vocab: int):
        self.matcher, self.seen = matcher, None
        self.mask = allocate_token_bitmask(1, vocab)

    def __call__(self, history: mx.array, logits: mx.array) -> mx.array:
        # the first call sees the prompt only; later ones read just the new tokens
        if self.seen is not None:
            for t in history[self.seen :].tolist():
                if not self.matcher.consume_token(t):
                    raise ValueError(f"the output left its grammar: {self.matcher.get_error()}")
        self.seen = history.shape[0]
        fill_next_token_bitmask(self.matcher, self.mask)
        if self.matcher.is_error():
            raise ValueError(f"constrained decoding failed: {self.matcher.get_error()}")
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
