"""Rank 0's index of the prompt cache: which prompts every rank keeps the KV cache of (each for its
own layers, under the same entry id), and which entry a new prompt should start from.

Pure bookkeeping, no arrays: the scheduler turns its answers into LOAD and SAVE steps, which every
rank applies in ring order, so all ranks hold the same entries at every step.
"""

import itertools
from dataclasses import dataclass

from mlx_lm.models.cache import PromptTrie, PromptTrieResult


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading tokens `a` and `b` share (tuples both: a list never equals a tuple)."""
    n = min(len(a), len(b))
    # the usual hit (a follow-up turn holds the whole cached prompt): one C-level compare
    if a[:n] == b[:n]:
        return n
    # a[:lo] == b[:lo], a[:hi] != b[:hi]: halve with slice compares, not a Python loop
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid)
    return lo


@dataclass(eq=False)
class CachedPrompt:
    id: int
    tokens: tuple[int, ...]
    used: int  # when a lookup last chose it (least recently used goes first)


class PrefixIndex:
    """Entries within a budget of `budget` tokens in all (the plan turns PROMPT_CACHE_GB into tokens
    for the rank holding the most layers); least recently used ones are evicted first. No entry is
    the start of another, and they sit in mlx-lm's token trie: a lookup walks the prompt once,
    whatever the number of entries (a burst of prompts looks up every waiting one each batch)."""

    def __init__(self, budget: int):
        self.budget = budget
        self.entries: dict[int, CachedPrompt] = {}
        self.trie = PromptTrie()  # tokens -> entry id, under the one key 0
        self.ids = itertools.count(1)
        self.clock = itertools.count()
        self.held = 0  # tokens in all entries
        # prompts that started from an entry, and the tokens they reused
        self.hits = self.hit_tokens = 0

    def _nearest(self, found: PromptTrieResult, n: int) -> tuple[CachedPrompt | None, int]:
        # The entry sharing the longest start with the `n` tokens the trie was searched for, and how
        # long: any entry below the deepest trie node the walk reached shares all of it.
        if found.exact is not None:
            return self.entries[self.trie.get(0, found.exact)], n
        if found.longer is None:
            return None, 0
        return self.entries[self.trie.get(0, found.longer)], found.common_prefix

    def lookup(self, prompt: list[int]) -> tuple[int, int]:
        """(entry, tokens to reuse) for the longest cached prefix of `prompt`, or (0, 0). The last
        token is always prefilled: its logits give the first new token."""
        best, n = self._nearest(self.trie.search(0, prompt), len(prompt))
        n = min(n, len(prompt) - 1)
        return (best.id, n) if best is not None and n > 0 else (0, 0)

    def use(self, entry: int, n: int) -> None:
        """A prompt starts from `entry`'s first `n` tokens."""
        self.entries[entry].used = next(self.clock)
        self.hits += 1
        self.hit_tokens += n

    def add(self, tokens: list[int]) -> tuple[int, list[int]]:
        """Make room for `tokens` and index them: (the new entry, the entries to drop first), or
        (0, []) when they need no entry (too long for the budget, or held by one already)."""
        tokens = list(tokens)
        if not 0 < len(tokens) <= self.budget:
            return 0, []
        found = self.trie.search(0, tokens)
        held, n = self._nearest(found, len(tokens))
        if n == len(tokens):  # the start of an entry (or one): held already
            held.used = next(self.clock)
            return 0, []
        # An entry that is the start of the new one only ever gives shorter hits: it goes first.
        drop = [self.entries[self.trie.get(0, found.shorter)]] if found.shorter else []
        room = self.held - sum(len(e.tokens) for e in drop)
        for e in sorted(self.entries.values(), key=lambda e: e.used):
            if room + len(tokens) <= self.budget:
                break
            if e not in drop:
                drop.append(e)
                room -= len(e.tokens)
        for e in drop:
            del self.entries[e.id]
            self.trie.pop(0, list(e.tokens))
        entry = CachedPrompt(next(self.ids), tuple(tokens), next(self.clock))
        self.entries[entry.id] = entry
        self.trie.add(0, tokens, entry.id)
        self.held = room + len(tokens)
        return entry.id, [e.id for e in drop]
