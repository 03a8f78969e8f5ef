"""What the scheduler (`scheduler.py`) moves around: sequences, the prefill batches they start
in, the decode groups they join, and the steps on the ring with what to do when each comes home."""

from dataclasses import dataclass, field
from typing import Callable

import mlx.core as mx

from mlx_ring.planning.growth import growth_step
from mlx_ring.ring.protocol import Kind
from mlx_ring.serving.params import SamplingParams
from mlx_ring.serving.sampling import SequenceSampler
from mlx_ring.serving.speculative import Drafter


@dataclass(eq=False)
class Sequence:
    id: int
    prompt: list[int]
    params: SamplingParams
    constrain: Callable | None = None  # params.grammar -> its logits processor (serving/grammar.py)
    sampler: SequenceSampler = field(init=False)
    last: int | None = None  # the last sampled token: the next decode step's input
    removed: bool = False
    # waits for that one's prefill, to start from its saved prompt (n > 1)
    after: "Sequence | None" = None
    prefilled: bool = False
    fed: int = 0  # sampled tokens its decode steps have put in its cache
    drafter: Drafter | None = None  # speculative decoding: its drafts and their length
    max_tokens: int = 0  # the completion limit: with its prompt, the cache it may come to need
    # its prompt's first tokens that came from the prompt cache (usage's cached tokens)
    cached: int = 0
    # its prompt's first tokens whose blocks a SAVE kept while it prefilled (a whole-block index)
    saved: int = 0
    # the prompt-cache keys of its prompt's full blocks (cache/blocks.py), once looked up
    keys: list[bytes] | None = None
    # of the full blocks after the RAM tier's, those every rank's disk gave back for its LOAD:
    # None before a FETCH asked, -1 while one is out
    fetched: int | None = None
    fetched_after: int = 0  # the RAM tier's blocks that FETCH followed

    def __post_init__(self):
        constraint = self.constrain(self.params.grammar) if self.params.grammar else None
        self.sampler = SequenceSampler(self.params, self.prompt, constraint)


def cache_rows(seqs: list[Sequence], grow: int, drafts: int = 0) -> int:
    """Token-rows a decode group of `seqs` may come to hold: every row left-padded to the longest
    prompt + max_tokens, with `drafts` more and the room the cache grows by (`grow` token-rows at
    a time, as planning/growth.py's rule says)."""
    n = len(seqs)
    return (
        n * (max(len(s.prompt) + s.max_tokens for s in seqs) + drafts + growth_step(n, grow))
        if n
        else 0
    )


@dataclass(eq=False)
class Prefill:
    """Prompts prefilled in the same steps, under one id: their cache on every rank is one batch."""

    id: int
    rows: list[Sequence]
    tokens: list[list[int]]  # per row, right-padded to one length
    sent: int = 0  # tokens of each row already submitted (or, before the first chunk, reused)
    chunks_out: int = 0  # chunks on the ring
    home: int = 0  # tokens of each row whose chunk has come home (the progress rank 0 shows)
    # the keys of the prompt-cache blocks each row starts from (empty: none)
    reuse: list[list[bytes]] = field(default_factory=list)
    group: "Group | None" = None  # the group it will join

    def padding(self) -> list[int]:
        return [len(self.tokens[0]) - len(s.prompt) for s in self.rows]

    def removed(self) -> bool:
        return all(s.removed for s in self.rows)

    def progress(self) -> list[tuple[Sequence, int]]:
        """Each row still wanted, with its prompt's tokens in the cache of every rank so far (the
        start it reused included)."""
        return [
            (s, min(len(s.prompt), max(self.home, s.cached))) for s in self.rows if not s.removed
        ]


@dataclass(eq=False)
class Group:
    id: int
    # in the order of the cache's rows on every rank
    rows: list[Sequence] = field(default_factory=list)
    # prefilled, to be appended before the next step
    joining: list[Prefill] = field(default_factory=list)
    reserved: int = 0  # rows being prefilled for this group
    busy: bool = False  # a decode step of this group is on the ring
    verifying: bool = False  # that step verifies drafts: its cache holds positions a TRIM may drop
    # rows that left meanwhile, saved once trimmed
    saves: list[Sequence] = field(default_factory=list)
    # positions every row drops before the group's next step (rejected drafts, on every rank)
    drop: int = 0
    last_turn: int = -1

    def load(self) -> int:
        return len(self.rows) + sum(len(b.rows) for b in self.joining)

    def coming(self) -> int:
        """Its rows, with those joining and those still being prefilled for it."""
        return self.load() + self.reserved

    def free(self) -> bool:
        """Empty, and no prompt is being prefilled for it (a model that does not batch)."""
        return not self.load() and not self.reserved


@dataclass
class Step:
    """What rank 0 must do when a step comes home."""

    kind: Kind
    prefill: Prefill | None = None
    offset: int = 0  # PREFILL: where the chunk starts in its rows
    group: Group | None = None
    rows: list[Sequence] = field(default_factory=list)
    # DECODE: each row's drafted tokens, verified by this step
    drafts: list[list[int]] | None = None
    last_chunk: bool = False
    tokens: int = 0  # PREFILL: the chunk's prompt tokens, every row counted
    done: Callable[[mx.array | None], None] | None = None


def kv_fits(
    groups: list[Group],
    prefilling: list[Prefill],
    group: Group,
    seqs: list[Sequence],
    kv_room: int,
    grow: int,
    drafts: int,
) -> bool:
    """Whether the decode groups' caches, `seqs` added to `group`, may all grow as far as they
    can within `kv_room` token-rows, the largest counted twice: a cache that grows or takes in
    joining rows is copied whole (mlx-lm's concatenate), the old one held until the copy is made.
    Alone, a request always fits (the API refuses one that cannot: `one_request`)."""
    members = {g: [*g.rows, *(s for b in g.joining for s in b.rows)] for g in groups}
    for b in prefilling:
        members[b.group] += b.rows
    if not any(members.values()):
        return True
    members[group] += seqs
    sizes = [cache_rows(m, grow, drafts) for m in members.values()]
    return sum(sizes) + max(sizes) <= kv_room


def one_request(kv_room: int, grow: int, drafts: int) -> int:
    """The most tokens (prompt and answer) one request alone may hold in `kv_room` token-rows: its
    cache, the room it grows by and its drafts, twice (the copy growing makes)."""
    return max(1, kv_room // 2 - grow - drafts)
