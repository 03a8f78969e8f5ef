"""A prompt-cache block's record on one rank, for a model whose layers are not all plain KV caches
(recurrent or hybrid layers, sliding windows): per layer, per part of its cache, the block's
positions (a KV cache's, and a sliding window's: what it holds at any point is its last positions),
or a fixed state (a convolution's or an SSM's arrays) as it was at the block's end.

Rank 0 cuts such a prompt's prefill chunks so that every block boundary ends a chunk, and reuses
whole blocks only (`cache/blocks.py`'s `whole` index): a rank notes each window's new positions and
each state at every boundary as the chunks go by (a prefill batch's `Kept`), and its SAVEs build
the blocks' records from them; a LOAD restores the positions joined and the last block's states.
"""

import math

import mlx.core as mx
from mlx.utils import tree_flatten

from mlx_ring.models.compat import (
    KV,
    STATE,
    WINDOW,
    block_parts,
    part_kind,
    prefill_span,
    restore_part,
    state_arrays,
    window_positions,
)
from mlx_ring.models.shape import read_shape
from mlx_ring.ring.protocol import ProtocolError


class Kept:
    """What one prefill batch's caches lose as its chunks go by and its SAVEs need: each sliding
    window's positions, chunk by chunk; each fixed state at every block boundary a chunk ended on;
    and the blocks its LOAD restored, by their first position (a SAVE may keep them again, as
    blocks that came back from disk). Rank 0 saves a prompt's blocks as their chunks come home,
    so a rank holds these for the chunks on the ring only."""

    def __init__(self, rank: int, block: int, loaded: list | None = None):
        self.rank, self.block = rank, block
        self.windows: dict[tuple[int, int], list[tuple[int, mx.array, mx.array]]] = {}
        self.states: dict[int, dict[tuple[int, int], tuple]] = {}  # block end -> part -> arrays
        self.loaded = {i * block: b for i, b in enumerate(loaded or [])}

    def take(self, caches: list, offset: int, n: int) -> list[mx.array]:
        """A chunk of `n` positions from `offset` has gone through `caches`. Returns the copies
        of the windows' new positions, for the caller to compute with the step: left lazy, each
        would hold its window's whole buffer of this chunk."""
        pieces = []
        for i, c in enumerate(caches):
            for p, part in enumerate(block_parts(c)):
                kind = part_kind(part)
                if kind == WINDOW:
                    piece = window_positions(part, n)
                    self.windows.setdefault((i, p), []).append((offset, *piece))
                    pieces += piece
                elif kind == STATE and (offset + n) % self.block == 0:
                    self.states.setdefault(offset + n, {})[i, p] = state_arrays(part)
        return pieces

    def record(self, caches: list, row: int, start: int, end: int) -> list[tuple]:
        """The block [start, end)'s record, per layer a tuple of its parts' arrays; what it was
        made of is let go (rank 0 asks for each block of a prompt once)."""
        if start in self.loaded:
            return self.loaded.pop(start)
        layers = []
        for i, c in enumerate(caches):
            parts = []
            for p, part in enumerate(block_parts(c)):
                kind = part_kind(part)
                if kind == KV:
                    parts.append(prefill_span(part, row, start, end))
                elif kind == WINDOW:
                    parts.append(self._window(i, p, start, end))
                else:
                    parts.append(self._state(i, p, end))
            layers.append(tuple(parts))
        self.states.pop(end, None)
        for key, pieces in self.windows.items():
            self.windows[key] = [w for w in pieces if not start <= w[0] < end]
        return layers

    def _window(self, i: int, p: int, start: int, end: int) -> tuple:
        got = [(s, k, v) for s, k, v in self.windows.get((i, p), []) if start <= s < end]
        if sum(k.shape[2] for _, k, _ in got) != end - start:
            raise ProtocolError(
                f"rank {self.rank}: no prefill chunks cover positions [{start}, {end}) of layer "
                f"{i}'s sliding window (rank 0's chunks must end at every block boundary)"
            )
        return tuple(mx.concatenate([g[j] for g in got], axis=2) for j in (1, 2))

    def _state(self, i: int, p: int, end: int) -> tuple:
        got = self.states.get(end, {}).get((i, p))
        if got is None:
            raise ProtocolError(
                f"rank {self.rank}: no prefill chunk ended at position {end}, where a block "
                "ends: rank 0's chunks must end at every block boundary"
            )
        return got


def restore(caches: list, blocks: list[list[tuple]], n: int) -> list:
    """`caches` (fresh, of the slice's kinds) holding a prompt's first `n` tokens, from the
    records of its whole blocks in order."""
    for i, c in enumerate(caches):
        for p, part in enumerate(block_parts(c)):
            restore_part(part, [b[i][p] for b in blocks], n)
    return caches


def state_bytes(caches: list) -> int:
    """Bytes of the fixed states in `caches` (after a forward: lazily, only their shapes are
    read), which each block keeps beside its positions."""
    return sum(
        a.nbytes
        for c in caches
        for part in block_parts(c)
        if part_kind(part) == STATE
        for a in state_arrays(part)
    )


def slice_state_bytes(cut, config: dict) -> int:
    """`state_bytes` of one prompt in a rank's cut of the model (`models/slicing.Slice`), from a
    dry run of its layers on one position: graphs built, nothing computed. -1 where the forward
    cannot run so (rank 0 then keeps no blocks)."""
    caches = cut.new_caches()
    carry = cut.carry  # what crosses ranks beside the hidden states, packed after them
    width = (
        carry.width + sum(math.prod(s) for s in carry.shapes)
        if carry
        else read_shape(config).hidden_size
    )
    dtype = next(
        v.dtype
        for _, v in tree_flatten(cut.model.parameters())
        if mx.issubdtype(v.dtype, mx.floating)
    )
    h = mx.zeros((1, 1), mx.int32) if cut.start == 0 else mx.zeros((1, 1, width), dtype)
    try:
        cut.forward(h, caches)
    except Exception:  # noqa: BLE001 -- any failure of the dry run: the states are not known
        return -1
    return state_bytes(caches)
