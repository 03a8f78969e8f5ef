"""Choosing rank 0's work: which step goes round the ring next.

Waiting prompts are prefilled together: several short ones in one step (right-padded to the longest,
as mlx-lm's batch generator does), a long one alone in chunks (its cache exactly what one process
would build). Then the batch joins a decode group: a micro-batch whose rows decode together in one
step per token. Sequences join and leave a group between its steps, without waiting for each other.
Each group has at most one decode step outstanding (its next tokens depend on the last), but
different groups and prefill chunks overlap: while group A is on rank 1, rank 0 computes its stage
of group B or of the next prompt chunk. Which prompts prefill together is `batching.py`'s; what
rank 0 does with a step that comes home is `runner.py`'s and `scheduler.py`'s.
"""

from collections import deque
from typing import Callable, Protocol

import mlx.core as mx

from mlx_ring.cache.blocks import BlockIndex, key_ints
from mlx_ring.ring.handle import RingHandle
from mlx_ring.ring.protocol import DTYPES, Header, Kind, StatusRow
from mlx_ring.serving.batching import Batching
from mlx_ring.serving.rows import Group, Prefill, Sequence, Step
from mlx_ring.serving.speculative import MODEL_DRAFT_ROWS, Drafter, ModelDrafter, Streak


class Ends(Protocol):
    """The ends of the model, which only rank 0 holds (`shard.Shard`); steps carry token ids, which
    the first stage embeds."""

    def head(self, h: mx.array) -> mx.array: ...  # (B, L, H) -> (B, L, V)

    # every layer keeps a plain KV cache: prompts can share a right-padded prefill batch
    plain_kv: bool
    batches: bool  # the model's layers take several rows at once (else: one row a decode group)


class Chooser(Batching):
    """The lanes of work (waiting prompts, prefill batches, decode groups, calls) and the choice
    of the next step. `groups`: decode micro-batches; new sequences join the smallest. 0: one per
    rank, the fewest that keep every rank at work once there are as many sequences (each rank
    runs one group's stage while the others run theirs); with fewer sequences, the empty groups
    take no steps."""

    def __init__(
        self,
        pipe: RingHandle,
        ends: Ends,
        *,
        groups: int = 0,
        chunk: int = 512,
        prefix: BlockIndex | None = None,
        draft_tokens: int = 0,
        draft_model=None,
        kv_room: int = 0,
        kv_spare: int = 0,
        prefill_budget: int = 0,
        prefill_step: int = 0,
    ):
        self.pipe, self.ends, self.chunk = pipe, ends, chunk
        # Prompt tokens (rows x chunk, over every prefill batch) on a rank's device at once: the
        # activations the plan counts (planning/activations.step_tokens), so a burst of prompts
        # is prefilled a few chunks at a time, never all queued at once; the caller counts the
        # ring's stages in (a pipeline's steps out are each on another rank). One chunk always
        # may go. 0: no bound.
        self.prefill_budget, self.prefill_out = prefill_budget, 0
        # Prompt tokens of one prefill step (rows x chunk): prompts longer than a chunk are
        # prefilled several at once where this allows more than one chunk (as mlx-lm's batch
        # generator and vLLM's token budget do), else each alone. 0: one chunk.
        self.prefill_step = max(prefill_step, chunk)
        # Token-rows the decode groups' caches may come to hold at once (0: no bound): a prompt
        # starts only when every group, each row padded to its longest prompt + max_tokens, still
        # fits (rows.cache_rows).
        self.kv_room, self.kv_spare = kv_room, kv_spare
        # most tokens a sequence drafts per step (0: no speculative decoding)
        self.draft_tokens = draft_tokens
        # drafts from this model (rank 0's own), else by prompt lookup
        self.draft_model = draft_model
        # the draft model's cycles in a row that kept nothing, over all streams
        self.streak = Streak()
        # None: no prompt cache (off, or no block can keep the model's caches)
        self.prefix = prefix
        self.fetched_for: Sequence | None = None  # the sequence whose FETCH the ranks hold
        # The fewest cached tokens a prompt starts from, or waits for another's prefill to
        # save: fewer are prefilled again, in a batch with others. A short shared start such as
        # a chat template's costs less to recompute than to load (on a GPU, with 512-token
        # chunks: under 64 tokens).
        self.least_reuse = max(1, chunk // 8)
        # callers pass 1 in tensor mode
        self.groups = [Group(g) for g in range(groups or pipe.ring.size)]
        self.waiting: deque[Sequence] = deque()  # FIFO: the oldest prompt goes first
        self.filling: Prefill | None = None  # the batch whose chunks are going out
        self.prefilling: list[Prefill] = []  # formed and not yet joined to their group (or dropped)
        self.to_free: list[Prefill] = []
        self.calls: deque[tuple[Header, mx.array | None, Callable]] = deque()
        self.turn = 0
        self.prefill_turn = -1

    # -- what the caller does -------------------------------------------------------------------
    def set_groups(self, n: int) -> None:
        """Decode in `n` groups from now on (while idle: every group's cache is
        gone on every rank)."""
        assert self.idle() and n >= 1
        self.groups = [Group(g) for g in range(n)]

    def add(self, seq: Sequence) -> None:
        if self.draft_tokens and seq.params.speculable():
            seq.drafter = (
                ModelDrafter(self.draft_tokens, model=self.draft_model, streak=self.streak)
                if self.draft_model
                else Drafter(self.draft_tokens)
            )
        if self.prefix is None or len(seq.prompt) - 1 < self.least_reuse:
            seq.after = None  # another choice of a prompt it cannot start from: prefilled beside it
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Stop `seq`: its rows and caches go at the next chance, on every rank. A sequence
        leaving a decode group leaves its prompt and answer in the prompt cache first (a chat's
        next turn starts with both): queued now, so a prompt that comes next finds it. Where the
        index keeps whole blocks only, a decode group's states at a block's end are long gone:
        only its prompt's blocks, saved at its prefill, stay."""
        if seq.removed:
            return
        seq.removed = True
        group = next((g for g in self.groups if seq in g.rows), None)
        saves = self.prefix and not self.prefix.whole and group is not None
        if saves and group.verifying:
            group.saves.append(seq)  # its cache row holds drafts until the step is back and trimmed
        elif saves:
            self._save_row(group, seq)

    def ping(self, done: Callable[[None], None]) -> None:
        """A step through every rank between the others; `done(None)` when it is back."""
        self.calls.append((Header(Kind.PING), None, lambda _: done(None)))

    def status(self, done: Callable[[list[dict]], None]) -> None:
        """Every rank's `StatusRow`, filled in as a step goes round; `done` gets them as dicts."""
        table = StatusRow.table(self.pipe.ring.size)
        self.calls.append(
            (Header.for_payload(Kind.STATUS, table), table, lambda t: done(StatusRow.parse(t)))
        )

    def idle(self) -> bool:
        return not (
            self.pipe.outstanding()
            or self.waiting
            or self.filling
            or self.calls
            or self.to_free
            or any(g.load() for g in self.groups)
        )

    def schedule(self) -> None:
        """Fill the ring with ready work: prompt chunks, joins, filters, decode steps and calls."""
        while self.pipe.can_submit() and self._submit_next():
            pass

    # -- choosing work --------------------------------------------------------------------------
    def _submit_next(self) -> bool:
        if self._submit_queued():
            return True
        lane = self._oldest_lane()
        if lane is False:
            return bool(self.calls) and self._submit_next()  # a FETCH the prefill lane just asked
        return self._submit_lane(lane)

    def _oldest_lane(self) -> Group | None | bool:
        """The ready lane that waited longest: a decode group, None for the prompt queue, False
        where none is ready. Decode groups and the prompt queue take turns, so a long prompt
        cannot starve decoding and decoding cannot starve a waiting prompt."""
        ready = [(g.last_turn, g) for g in self.groups if not g.busy and g.load()]
        if self._prefill_ready():
            ready.append((self.prefill_turn, None))
        return min(ready, key=lambda x: x[0])[1] if ready else False

    def _submit_lane(self, lane: Group | None) -> bool:
        self.turn += 1
        if lane is None:
            self.prefill_turn = self.turn
            return self._submit_chunk(self.filling or self._next_batch())
        return self._submit_decode(lane)

    def _submit_queued(self) -> bool:
        """A call or a FREE, which go before any lane's work; False when none waits."""
        if self.calls:
            header, payload, done = self.calls.popleft()
            return self._submit(header, payload, Step(header.kind, done=done))
        if self.to_free:
            batch = self.to_free.pop()
            return self._submit(Header(Kind.FREE, batch=batch.id), None, Step(Kind.FREE))
        return False

    def _prefill_ready(self) -> bool:
        # every client left: stop its chunks
        if self.filling is not None and self.filling.removed():
            if not self.filling.chunks_out:
                self._drop(self.filling)  # else freed when its last chunk on the ring is back
            self.filling = None
        while self.waiting and self.waiting[0].removed:
            self.waiting.popleft()  # nothing of it exists on any rank yet
        if (
            self.prefill_budget
            and self.prefill_out
            and self.prefill_out + self._next_tokens() > self.prefill_budget
        ):
            return False  # the chunks on the device first
        if self.filling:
            return True
        # A model that does not batch starts a prompt only when a decode group is empty for it.
        room = self.ends.batches or any(g.free() for g in self.groups)
        first = next((s for s in self.waiting if self._free_to_start(s)), None)
        if first is not None and self._fetching(first):
            return False  # its batch forms once its blocks are back from disk
        # FIFO: none passes it
        return room and first is not None and self._kv_fits(self._group_for(), [first])

    def _next_tokens(self) -> int:
        """Prompt tokens of the next prefill step: the filling batch's next chunk (none
        for its LOAD), else a whole step's: a new batch waits for room to take as many
        rows as a step holds."""
        b = self.filling
        if b is None:
            return min(self.prefill_step, self.prefill_budget or self.prefill_step)
        return 0 if b.reuse else len(b.rows) * (self._chunk_end(b) - b.sent)

    def _submit_decode(self, g: Group) -> bool:
        if self._submit_rows_change(g) or not g.rows:
            return True
        drafting = self._drafting(g.rows)
        drafts = [
            s.drafter.draft(s.sampler.history) if s.drafter and drafting else [] for s in g.rows
        ]
        width = max(map(len, drafts))
        if not width:
            return self._submit_decode_of(g, mx.array([[s.last] for s in g.rows]))
        # Every row feeds its last token and its drafts, padded to one width
        # (padding is never kept).
        tokens = mx.array(
            [[s.last, *d, *[s.last] * (width - len(d))] for s, d in zip(g.rows, drafts)]
        )
        return self._submit_decode_of(g, tokens, drafts=drafts)

    def _submit_rows_change(self, g: Group) -> bool:
        """The next step that changes `g`'s rows before its next decode step (rejected drafts
        dropped first, then rows leaving, then rows joining); False when none is left."""
        # Rows leave and join only while none of the group's steps is on the ring, and every rank
        # applies the FILTER / JOIN steps in ring order, so all ranks agree on which row is which.
        keep = [i for i, s in enumerate(g.rows) if not s.removed]
        if g.drop and keep and (len(keep) < len(g.rows) or g.joining):
            # rows leave or join once rejected drafts are gone
            return self._submit(*self._trim(g), Step(Kind.TRIM))
        if len(keep) < len(g.rows):
            g.drop = 0  # nothing left to trim, or the trim went first
            g.rows = [g.rows[i] for i in keep]
            # none left: the group's cache goes
            rows = mx.array(keep, dtype=mx.int32) if keep else None
            header = (
                Header.for_payload(Kind.FILTER, rows, group=g.id)
                if keep
                else Header(Kind.FILTER, group=g.id)
            )
            return self._submit(header, rows, Step(Kind.FILTER))
        while g.joining:
            b = g.joining.pop(0)
            if b.removed():
                self.to_free.append(b)
                continue
            g.rows += b.rows  # rows whose client left meanwhile go with the next FILTER
            padding = mx.array(b.padding(), dtype=mx.int32)
            return self._submit(
                Header.for_payload(Kind.JOIN, padding, batch=b.id, group=g.id),
                padding,
                Step(Kind.JOIN),
            )
        return False

    def _may_chain(self, g: Group, rows: list[Sequence]) -> bool:
        """Whether `g`'s next step may go out on the ids of its step home now (`rows`) before they
        are read: the calls, frees, rows leaving or joining and lanes that waited longer go just
        before it where the ring has room (`Scheduler._chained`). Not while rejected drafts wait
        to be dropped, and not when a row would draft next: drafts need this step's tokens read
        (none drafts where speculative decoding is off: no call a row a step to ask)."""
        coming = [s for s in rows if not s.removed] + [s for b in g.joining for s in b.rows]
        return (
            self.pipe.can_submit(chained=True)
            and not g.drop
            and rows == g.rows
            and not (
                self.draft_tokens
                and self._drafting(coming)
                and any(map(self._may_draft_next, coming))
            )
        )

    @staticmethod
    def _may_draft_next(s: Sequence) -> bool:
        return (
            s.drafter is not None
            and not s.drafter.pause
            and s.drafter.may_propose_next(s.sampler.history)
        )

    def _drafting(self, rows: list[Sequence]) -> bool:
        return self.draft_model is None or len(rows) <= MODEL_DRAFT_ROWS

    def _submit_decode_of(
        self, g: Group, tokens: mx.array, chained: bool = False, drafts: list | None = None
    ) -> bool:
        self.turn += 1
        g.last_turn = self.turn
        g.busy, g.verifying = True, drafts is not None
        for s in g.rows:
            s.fed += 1  # the input token; accepted drafts are counted when the step is back
            if chained and s.drafter:
                s.drafter.skip()
        # Token ids (B, L), L = 1 + drafts: the first stage embeds them. Sampled ids may be uint32,
        # which the ring carries as int32 (the header's dtype is what goes on the wire).
        step = Step(Kind.DECODE, group=g, rows=list(g.rows), drafts=drafts)
        header, g.drop = (
            Header(
                Kind.DECODE,
                offset=g.drop,
                shape=tuple(tokens.shape),
                dtype=DTYPES.index(mx.int32),
                group=g.id,
            ),
            0,
        )
        return self._submit(header, tokens, step, chained)

    def _submit(
        self, header: Header, payload: mx.array | None, step: Step, chained: bool = False
    ) -> bool:
        self.pipe.submit(header, payload, step, chained)
        return True

    @staticmethod
    def _trim(g: Group, drops: list[int] | None = None) -> tuple[Header, mx.array]:
        """The TRIM step that drops `drops` (else the group's pending `drop`)
        from the group's rows."""
        payload = mx.array(drops or [g.drop] * len(g.rows), dtype=mx.int32)
        g.drop = 0
        return Header.for_payload(Kind.TRIM, payload, group=g.id), payload

    def _save_row(self, g: Group, seq: Sequence) -> None:
        # queued as calls, the trim first: they go before anything else touches the group
        if g.drop:
            self.calls.append((*self._trim(g), lambda _: None))
        assert len(seq.sampler.history) >= len(seq.prompt) + seq.fed
        self._save(
            Kind.SAVE_ROW,
            g.id,
            [(g.rows.index(seq), seq.sampler.history[: len(seq.prompt) + seq.fed], 0)],
        )

    def _save(self, kind: Kind, source: int, rows: list[tuple[int, list[int], int]]) -> None:
        # Queued as a call, so it goes before the JOIN, FREE or FILTER that would change that cache.
        # Rows saved together (a prefill batch, rows leaving at once) go in one step; each row's
        # tokens with those of them an earlier SAVE kept (BlockIndex.add's `since`).
        lines, disk = [], self.prefix.on_disk is not None
        for row, tokens, since in rows:
            saved = self.prefix.add(tokens, since)
            lines += [(-1, 0, 0, 0, *key_ints(k)) for k in saved.drop]
            lines += [
                (row, len(tokens), start, int(ram), *key_ints(k))
                for start, k, ram in saved.keep
                if ram or disk
            ]
        where = {"batch": source} if kind == Kind.SAVE else {"group": source}
        header = Header(kind, offset=self.prefix.block, **where)
        # the last call saves from the same cache
        if self.calls and self.calls[-1][0].same_step(header):
            lines = [tuple(line) for line in self.calls.pop()[1].tolist()] + lines
        if lines:
            payload = mx.array(lines, dtype=mx.int32)  # (k, 8): (row, tokens, start, ram, key)
            header = Header.for_payload(kind, payload, offset=self.prefix.block, **where)
            self.calls.append((header, payload, lambda _: None))
