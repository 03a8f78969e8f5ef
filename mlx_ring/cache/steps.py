"""The prompt cache's steps on a rank: LOAD (a prefill batch's caches made from held blocks), SAVE
and SAVE_ROW (blocks kept from a prefill batch's caches or a decode group's rows) and FETCH (blocks
brought back from this rank's disk). `shard.Shard` takes them in beside its forward steps; they
move KV between its caches and its `HeldBlocks` (cache/held.py).
"""

import mlx.core as mx

from mlx_ring.cache.held import HeldBlocks
from mlx_ring.cache.states import Kept, restore
from mlx_ring.models.compat import (
    cache_from_saved,
    group_span,
    merge_caches,
    positions,
    prefill_span,
)
from mlx_ring.models.slicing import Slice
from mlx_ring.ring.protocol import Header, ProtocolError


class CacheSteps:
    """The LOAD, SAVE, SAVE_ROW and FETCH steps of a shard, over the shard's own state."""

    rank: int
    plain_kv: bool  # every layer's cache a plain KV cache (else blocks keep their states too)
    block: int  # tokens a block holds (0: no prompt cache)
    held: HeldBlocks
    kept: dict[int, Kept]  # prefill batch -> what its SAVEs need that its caches lose
    prefills: dict[int, list]  # prefill batch -> per-layer caches
    groups: dict[int, list]  # group -> per-layer batched caches
    slice: Slice
    tensor: bool  # a share of every layer: a FETCH's misses join in one all_sum
    world: mx.distributed.Group | None

    def _load(self, header: Header, keys: mx.array) -> mx.array:
        if not self.plain_kv:  # one row: fresh caches from its blocks, which its SAVE may keep
            blocks = self.held.load(keys.tolist(), header.offset, lambda b, n: b)[0]
            self.kept[header.batch] = Kept(self.rank, self.block, blocks)
            self.prefills[header.batch] = restore(self.slice.new_caches(), blocks, header.offset)
            return keys  # the next rank loads the same
        rows = [
            [cache_from_saved(kv, header.offset) for kv in layers]
            for layers in self.held.load(keys.tolist(), header.offset)
        ]
        self.prefills[header.batch] = rows[0] if len(rows) == 1 else merge_caches(rows)
        return keys  # the next rank loads the same

    def _save(self, header: Header, lines: mx.array) -> mx.array:
        caches = self.prefills[header.batch]
        # not all plain KV caches: the states its chunks noted at the blocks' ends, taken now
        kept = (
            None
            if self.plain_kv
            else self.kept.setdefault(header.batch, Kept(self.rank, self.block))
        )

        def span(row: int, n: int, start: int, end: int) -> list:
            if kept is not None:
                return kept.record(caches, row, start, end)
            return [prefill_span(c, row, start, end) for c in caches]

        self.held.keep(lines.tolist(), header.offset, span)
        return lines  # the next rank keeps the same

    def _save_row(self, header: Header, lines: mx.array) -> mx.array:
        caches = self.groups[header.group]
        held = positions(caches).tolist()  # tokens per row: one read for the whole step
        for row, n, *_ in lines.tolist():
            if row >= 0 and held[row] != n:
                raise ProtocolError(
                    f"rank {self.rank}: row {row} holds {held[row]} tokens, rank 0 expects {n}"
                )
        self.held.keep(
            lines.tolist(),
            header.offset,
            lambda row, n, start, end: [group_span(c, row, n, start, end) for c in caches],
        )
        return lines  # the next rank keeps the same

    def _fetch(self, header: Header, lines: mx.array) -> mx.array:
        out = self.held.fetch(lines)
        # every rank's misses in one all_sum (tensor mode), else passed on for the next to add to
        if self.tensor:
            return mx.distributed.all_sum(out, group=self.world)
        return out
