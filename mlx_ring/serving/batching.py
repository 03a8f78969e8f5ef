"""Rank 0's prefill batches: which waiting prompts prefill together, from how many cached tokens,
for which decode group (its rows reserved there until the batch joins or is dropped), and the steps
that send a batch round the ring (its LOAD, then its chunks)."""

import mlx.core as mx

from mlx_ring.cache.blocks import common_prefix, key_ints
from mlx_ring.ring.protocol import Header, Kind
from mlx_ring.serving.rows import Group, Prefill, Sequence, Step, kv_fits


class Batching:
    """The prefill lane's batches, a base of `choosing.Chooser`: its state (the waiting prompts,
    the decode groups, the prompt cache, the prefill budget) and `_submit` are the chooser's."""

    def _group_for(self) -> Group:
        # A batch joins one decode group whole, chosen now: prompts that arrive together are spread
        # over the groups, each batch filling its group up to an even share of all rows.
        return (
            next(g for g in self.groups if g.free())
            if not self.ends.batches
            else min(self.groups, key=Group.coming)
        )

    def _kv_fits(self, group: Group, seqs: list[Sequence]) -> bool:
        return not self.kv_room or kv_fits(
            self.groups,
            self.prefilling,
            group,
            seqs,
            self.kv_room,
            self.kv_spare,
            self.draft_tokens,
        )

    def _drop(self, b: Prefill) -> None:
        self.to_free.append(b)
        self._release(b)

    def _release(self, b: Prefill) -> Group | None:
        """The group `b` was prefilled for, its rows no longer reserved there."""
        if b in self.prefilling:
            self.prefilling.remove(b)
        group, b.group = b.group, None
        if group is not None:
            group.reserved -= len(b.rows)
        return group

    @staticmethod
    def _free_to_start(s: Sequence) -> bool:
        return not s.removed and (s.after is None or s.after.prefilled or s.after.removed)

    def _next_batch(self) -> Prefill:
        # The oldest prompt free to start, and as many waiting prompts as fit one chunk once padded
        # to the longest (with plain KV caches only: a sliding window or a recurrent state would
        # take in the padding). They start from the same number of cached tokens, each from its own
        # entry: the oldest one's reuse, which no other may beat by `least_reuse` (it waits to go
        # from its own).
        first = next(s for s in self.waiting if self._free_to_start(s))
        group = self._group_for()
        rows_now = sum(map(self._free_to_start, self.waiting)) + sum(map(Group.coming, self.groups))
        share = max(1, -(-rows_now // len(self.groups)) - group.coming())
        self.waiting.remove(first)
        entry, reused = self._lookup(first)
        rows, entries, longest = [first], [entry], len(first.prompt)
        room = self.prefill_step  # tokens of each of the batch's steps: rows x its chunk
        if self.prefill_budget and self.prefill_out:
            room = min(room, self.prefill_budget - self.prefill_out)  # what the steps out leave
        for s in list(self.waiting) if self.ends.plain_kv and self.ends.batches else []:
            e, r = self._lookup(s)
            if not self._free_to_start(s) or not reused <= r < reused + self.least_reuse:
                continue
            n = max(longest, len(s.prompt))
            if (
                min(n - reused, self.chunk) * (len(rows) + 1) > room
                or len(rows) == share
                or self._ends_apart([*rows, s], n, reused)
                or not self._kv_fits(group, [*rows, s])
            ):
                break
            self.waiting.remove(s)
            rows.append(s)
            entries.append(e)
            longest = n
        reuse = [self._blocks_for(e, reused) for e in entries] if reused else []
        for s in rows if reused else []:
            hit = self.prefix.lookup(s.prompt, s.keys)
            self.prefix.use(hit, reused, self._from_disk(s, reused))
        self.fetched_for = None  # its blocks go with this LOAD (or are dropped by it)
        for row in rows:
            row.cached = reused
        if self.prefix:
            self._wait_for_shared(rows)
        tokens = [s.prompt + [0] * (longest - len(s.prompt)) for s in rows]
        self.filling = Prefill(first.id, rows, tokens, sent=reused, reuse=reuse, group=group)
        self.prefilling.append(self.filling)
        group.reserved += len(rows)
        return self.filling

    def _ends_apart(self, rows: list[Sequence], longest: int, reused: int) -> bool:
        """Whether some of `rows`, right-padded to `longest`, would end before the batch's last
        chunk: rank 0 reads each row's first token from that chunk (runner.prefill), and a row
        ending chunks earlier would be padding for whole steps."""
        last = (longest - reused - 1) // self.chunk
        return any((len(r.prompt) - reused - 1) // self.chunk != last for r in rows)

    def _lookup(self, s: Sequence) -> tuple[list[bytes], int]:
        """The keys of the blocks `s` may start from and the tokens they give (none where fewer than
        `least_reuse`): the RAM tier's, and the full blocks its FETCH brought back after them."""
        if not self.prefix:
            return [], 0
        if s.keys is None:
            s.keys = self.prefix.keys(s.prompt)
        hit = self.prefix.lookup(s.prompt, s.keys)
        keys, n = [b.key for b in hit.blocks], hit.tokens
        full = len(keys) if hit.on_disk else len(keys) - (n % self.prefix.block > 0)
        if s is self.fetched_for and s.fetched and full == s.fetched_after:
            keys = s.keys[: full + s.fetched]
            n = len(keys) * self.prefix.block
        return (keys, n) if n >= self.least_reuse else ([], 0)

    def _blocks_for(self, keys: list[bytes], n: int) -> list[bytes]:
        """The first of `keys` that hold `n` tokens."""
        return keys[: -(-n // self.prefix.block)]

    def _from_disk(self, s: Sequence, n: int) -> int:
        """Of the `n` tokens `s` starts from, the full blocks its FETCH brought back."""
        if s is not self.fetched_for or not s.fetched:
            return 0
        return max(0, n // self.prefix.block - s.fetched_after)

    def _fetching(self, s: Sequence) -> bool:
        """Whether `s` waits for its blocks on rank 0's disk to come back on every rank, asking for
        them (a FETCH step) the first time: only then does its batch know what it starts from."""
        if s.fetched is not None or not self.prefix or self.prefix.on_disk is None:
            return s.fetched == -1
        if s.keys is None:
            s.keys = self.prefix.keys(s.prompt)
        hit = self.prefix.lookup(s.prompt, s.keys)
        if not hit.on_disk:
            s.fetched = 0
            return False
        start = len(hit.blocks)
        lines = mx.array(
            [[0, *key_ints(k)] for k in s.keys[start : start + hit.on_disk]], dtype=mx.int32
        )
        s.fetched, s.fetched_after, self.fetched_for = -1, start, s

        def done(out: mx.array) -> None:
            misses = out[:, 0].tolist()  # every rank's, added up: a block counts where none missed
            s.fetched = next((i for i, m in enumerate(misses) if m), len(misses))

        self.calls.append((Header.for_payload(Kind.FETCH, lines), lines, done))
        return True

    def _wait_for_shared(self, rows: list[Sequence]) -> None:
        # A waiting prompt that shares a longer start with one of `rows` than the cache holds
        # for it waits for that row's prefill, then starts from its saved prompt: the shared
        # part is computed once.
        starts = [(r, tuple(r.prompt)) for r in rows]
        for s in self.waiting:
            if s.after is not None or s.removed:
                continue
            cached, prompt = self._lookup(s)[1], tuple(s.prompt)
            s.after = next(
                (
                    r
                    for r, start in starts
                    if self._gain(start, prompt) >= cached + self.least_reuse
                ),
                None,
            )

    def _gain(self, start: tuple[int, ...], prompt: tuple[int, ...]) -> int:
        """The tokens `prompt` could start from once `start` is saved: those they share (whole
        blocks of its cacheable part, where the index keeps whole blocks only)."""
        shared = common_prefix(start, prompt)
        if not self.prefix.whole:
            return shared
        return min(shared, len(prompt) - 1) // self.prefix.block * self.prefix.block

    def _chunk_end(self, b: Prefill) -> int:
        """Where the batch's next chunk ends: a chunk on, at the prompt's end, or at the next
        block boundary where the index keeps whole blocks (the ranks note each block's states
        at its end)."""
        end = min(b.sent + self.chunk, len(b.tokens[0]))
        if self.prefix is not None and self.prefix.whole:
            end = min(end, (b.sent // self.prefix.block + 1) * self.prefix.block)
        return end

    def _submit_chunk(self, b: Prefill) -> bool:
        # first, on every rank: each row's cache starts as its entry's first `sent` tokens
        if b.reuse:
            keys = mx.array([[key_ints(k) for k in row] for row in b.reuse], dtype=mx.int32)
            b.reuse = []
            return self._submit(
                Header.for_payload(Kind.LOAD, keys, batch=b.id, offset=b.sent),
                keys,
                Step(Kind.LOAD),
            )
        offset = b.sent
        tokens = [t[offset : self._chunk_end(b)] for t in b.tokens]
        ids = mx.array(tokens, dtype=mx.int32)  # (B, L): the first stage embeds them
        b.sent += len(tokens[0])
        b.chunks_out += 1
        self.prefill_out += len(tokens) * len(tokens[0])
        last = b.sent == len(b.tokens[0])
        if last:
            self.filling = None  # its chunks are all out; the next batch may start behind them
        header = Header.for_payload(Kind.PREFILL, ids, batch=b.id, offset=offset)
        return self._submit(
            header,
            ids,
            Step(
                Kind.PREFILL,
                prefill=b,
                offset=offset,
                last_chunk=last,
                tokens=len(tokens) * len(tokens[0]),
            ),
        )
