"""Rank 0's index of the prompt cache, kept in blocks: which blocks every rank holds in RAM (each
for its own layers, under the same key), and how much of a new prompt they cover.

A prompt's KV is cut into blocks of `block` tokens. Each block's key chains its parent's key and its
own tokens from a salt naming the weights and the cache's format, so equal keys mean equal KV, on
every rank, across restarts. Full blocks also go to each rank's disk (`cache/disk.py`); a prompt's
last, partial block (its tail) stays in RAM only. A new prompt reuses the leading blocks it shares
with any cached prompt, and then the longest start of one more block (a tail, or a full block that
differs further on), so a chat's next turn reuses its last turn to the token. A model whose layers
keep a recurrent state or a sliding window restores a block's state at its end only: its index
(`whole`) holds and gives whole blocks only.

Pure bookkeeping, no arrays: the scheduler turns its answers into LOAD, SAVE and FETCH steps, which
every rank applies in ring order, so all ranks hold the same RAM blocks at every step.
"""

import heapq
import itertools
import struct
from array import array
from dataclasses import dataclass, field
from hashlib import blake2b

BLOCK = 256  # tokens a block holds, unless the PROMPT_CACHE_BLOCK setting says otherwise
KEY_BYTES = 16
KEY_INTS = KEY_BYTES // 4  # a key on the wire: int32s


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


def chain_keys(tokens: list[int], salt: bytes, block: int, tail: bool = False) -> list[bytes]:
    """The keys of `tokens`' full blocks in order (and of its partial last one, with `tail`)."""
    ids, keys, parent = array("i", tokens), [], salt
    ends = list(range(block, len(tokens) + 1, block))
    if tail and len(tokens) % block:
        ends.append(len(tokens))
    for end in ends:
        start = end - block if end % block == 0 else end - len(tokens) % block
        parent = blake2b(parent + ids[start:end].tobytes(), digest_size=KEY_BYTES).digest()
        keys.append(parent)
    return keys


def key_ints(key: bytes) -> tuple[int, ...]:
    """A key as the int32s that carry it in a step's payload."""
    return struct.unpack(f"<{KEY_INTS}i", key)


def key_of(ints) -> bytes:
    """The key a payload's int32s carry."""
    return struct.pack(f"<{KEY_INTS}i", *ints)


@dataclass(eq=False)
class Block:
    key: bytes
    tokens: tuple[int, ...]
    parent: "Block | None"
    children: list["Block"] = field(default_factory=list)
    used: int = 0  # when a lookup or save last touched it (least recently used goes first)


@dataclass
class Hit:
    """What the RAM tier holds of a prompt's start: its blocks (the last may be partly used), the
    tokens they give, and how many full blocks after them rank 0's own disk holds."""

    blocks: list[Block]
    tokens: int
    on_disk: int = 0


@dataclass
class Saved:
    """A SAVE's lines, for one row: the blocks to drop first, then each new block (its first
    position, its key, whether the RAM tier keeps it: else only the disks do)."""

    drop: list[bytes]
    keep: list[tuple[int, bytes, bool]]


class BlockIndex:
    """RAM blocks within `budget` tokens in all (the plan turns PROMPT_CACHE_GB into tokens for
    the rank holding the most layers); a block's suffixes go before it, the least recently used
    first. `on_disk(key)`: whether rank 0's own disk holds a full block (None: no disk tier).
    `whole`: no tails and no partial hits (each block's state is known at its end only)."""

    def __init__(
        self, budget: int, salt: bytes = b"", block: int = BLOCK, on_disk=None, whole=False
    ):
        assert block > 0
        self.budget, self.salt, self.block, self.on_disk = budget, salt, block, on_disk
        self.whole = whole
        self.disk = None  # rank 0's disk tier, for its figures (cache/tiers.block_index sets it)
        self.blocks: dict[bytes, Block] = {}
        self.roots: list[Block] = []  # blocks at a prompt's start
        self.clock = itertools.count(1)
        self.leaves: list[tuple[int, int, Block]] = []  # heap of (used, tiebreak, block)
        self.ties = itertools.count()
        self.held = 0  # tokens in all RAM blocks
        # prompts that started from cached blocks, the tokens they reused, those from disk
        self.hits = self.hit_tokens = self.disk_tokens = 0

    @property
    def entries(self) -> dict[bytes, Block]:
        return self.blocks

    def keys(self, tokens: list[int]) -> list[bytes]:
        """The chain keys of the full blocks of a prompt's cacheable part (all but its last token,
        whose logits give the first new token)."""
        return chain_keys(tokens[: len(tokens) - 1], self.salt, self.block)

    def lookup(self, prompt: list[int], keys: list[bytes] | None = None) -> Hit:
        """The RAM blocks of the longest cached start of `prompt` (`keys`: `self.keys(prompt)`,
        passed where known), and the full blocks after them on rank 0's disk."""
        keys = self.keys(prompt) if keys is None else keys
        path: list[Block] = []
        for k in keys:
            b = self.blocks.get(k)
            if b is None:
                break
            path.append(b)
        n, limit = len(path) * self.block, len(prompt) - 1
        on_disk = 0
        if self.on_disk is not None:
            while len(path) + on_disk < len(keys) and self.on_disk(keys[len(path) + on_disk]):
                on_disk += 1
        rest = tuple(prompt[n : min(n + self.block, limit)])
        best, m = None, 0
        for child in [] if self.whole else path[-1].children if path else self.roots:
            c = common_prefix(child.tokens[: len(rest)], rest)
            if c > m:
                best, m = child, c
        if best is not None and not on_disk:
            return Hit([*path, best], n + m)
        return Hit(path, n, on_disk)

    def use(self, hit: Hit, tokens: int, from_disk: int = 0) -> None:
        """A prompt starts from `tokens` of `hit`'s blocks and of `from_disk` full blocks after
        them, read back from disk."""
        now = next(self.clock)
        for b in hit.blocks:
            self._touch(b, now)
        self.hits += 1
        self.hit_tokens += tokens
        self.disk_tokens += from_disk * self.block

    def add(self, tokens: list[int], since: int = 0) -> Saved:
        """Index the blocks of `tokens` (a prompt, or a prompt and its answer): the RAM tier keeps
        what fits, evicting least recently used leaves off this chain first; full blocks past what
        fits are for the disks only. Tails that the new blocks start with go (a `whole` index
        keeps full blocks only). `since`: the leading tokens an earlier call kept, whose blocks
        get no line again (one no longer in RAM is on the disks only)."""
        B, now = self.block, next(self.clock)
        keys = chain_keys(list(tokens), self.salt, B, tail=not self.whole)
        drop: list[bytes] = []
        keep: list[tuple[int, bytes, bool]] = []
        parent: Block | None = None
        in_ram = True  # a RAM block's parent is in RAM: lookups walk down from the roots
        for i, key in enumerate(keys):
            start, piece = i * B, tuple(tokens[i * B : (i + 1) * B])
            full = len(piece) == B
            held = self.blocks.get(key) if in_ram else None
            if held is not None:
                self._touch(held, now)
                parent = held
                continue
            if start < since:
                in_ram = False
                continue
            if in_ram and not full and self._covered(parent, piece):
                break  # a held block starts with this tail: it gives the same hits
            if in_ram:
                in_ram = self._make_room(len(piece), parent, drop)
            if in_ram:
                for t in [c for c in self._children(parent) if self._starts(piece, c)]:
                    drop += self._evict(t)
                parent = self._insert(key, piece, parent, now)
            if full or in_ram:
                keep.append((start, key, in_ram))
            if not in_ram and not full:
                break
        return Saved(drop, keep)

    # -- the tree --------------------------------------------------------------------------------
    def _children(self, parent: Block | None) -> list[Block]:
        return parent.children if parent is not None else self.roots

    def _covered(self, parent: Block | None, piece: tuple[int, ...]) -> bool:
        return any(c.tokens[: len(piece)] == piece for c in self._children(parent))

    def _starts(self, piece: tuple[int, ...], b: Block) -> bool:
        """Whether `b`, a partial block, is the start of `piece`: it only gives shorter hits."""
        return len(b.tokens) < len(piece) and piece[: len(b.tokens)] == b.tokens and not b.children

    def _insert(self, key: bytes, piece: tuple[int, ...], parent: Block | None, now: int) -> Block:
        b = Block(key, piece, parent, used=now)
        self.blocks[key] = b
        self._children(parent).append(b)
        self.held += len(piece)
        heapq.heappush(self.leaves, (now, next(self.ties), b))
        return b

    def _touch(self, b: Block, now: int) -> None:
        b.used = now
        if not b.children:
            heapq.heappush(self.leaves, (now, next(self.ties), b))

    def _make_room(self, n: int, chain: Block | None, drop: list[bytes]) -> bool:
        """Evict least recently used leaves until `n` more tokens fit; never `chain` or the
        blocks above it. False when they cannot fit."""
        if n > self.budget:
            return False
        protected = set()
        while chain is not None:
            protected.add(id(chain))
            chain = chain.parent
        skipped = []
        while self.held + n > self.budget and self.leaves:
            used, tie, b = heapq.heappop(self.leaves)
            if self.blocks.get(b.key) is not b or b.children or used != b.used:
                continue  # stale: gone, no longer a leaf, or touched since
            if id(b) in protected:
                skipped.append((used, tie, b))
                continue
            drop += self._evict(b)
        for s in skipped:
            heapq.heappush(self.leaves, s)
        if len(self.leaves) > 4 * len(self.blocks) + 64:  # stale entries pile up: rebuild
            self.leaves = [(b.used, next(self.ties), b) for b in self.blocks.values()]
            self.leaves = [e for e in self.leaves if not e[2].children]
            heapq.heapify(self.leaves)
        return self.held + n <= self.budget

    def _evict(self, b: Block) -> list[bytes]:
        """Drop leaf `b`; its parent may become a leaf."""
        assert not b.children
        del self.blocks[b.key]
        self._children(b.parent).remove(b)
        self.held -= len(b.tokens)
        if b.parent is not None and not b.parent.children:
            heapq.heappush(self.leaves, (b.parent.used, next(self.ties), b.parent))
        return [b.key]
