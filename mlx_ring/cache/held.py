"""One rank's blocks of the prompt cache, for its own layers: the RAM tier (the blocks rank 0's
index says every rank holds), the blocks a FETCH brought back from this rank's disk for the LOAD
that follows it, and the writes to that disk. The SAVE, SAVE_ROW, FETCH and LOAD steps of
`shard.Shard` drive it; only the engine thread calls it, and it alone turns arrays into bytes and
back: the disk tier's threads see bytes only.
"""

import logging

import mlx.core as mx
import numpy as np

from mlx_ring.cache.blocks import KEY_INTS, key_of
from mlx_ring.cache.kvbits import OFF
from mlx_ring.ring.protocol import ProtocolError

log = logging.getLogger(__name__)


def to_record(layers: list[tuple[mx.array, ...]]):
    """A block's per-layer arrays as the disk tier's bytes (the arrays evaluated)."""
    from mlx_ring.cache.disk import Record

    arrays = {}
    for i, kv in enumerate(layers):
        for j, a in enumerate(kv):
            raw = np.array(a.view(mx.uint8)).tobytes()
            arrays[f"{i}.{j}"] = (str(a.dtype).removeprefix("mlx.core."), tuple(a.shape), raw)
    return Record(arrays)


def from_record(record) -> list[tuple[mx.array, ...]]:
    """The per-layer arrays of a block read back from disk."""
    layers: dict[int, dict[int, mx.array]] = {}
    for name, (dtype, shape, raw) in record.arrays.items():
        i, j = map(int, name.split("."))
        u8 = np.frombuffer(raw, dtype=np.uint8).reshape(*shape[:-1], -1)
        layers.setdefault(i, {})[j] = mx.array(u8).view(getattr(mx, dtype)).reshape(shape)
    return [tuple(kv[j] for j in sorted(kv)) for _, kv in sorted(layers.items())]


class HeldBlocks:
    """The blocks one rank holds, each a per-layer list of (keys, values) over its tokens."""

    def __init__(self, rank: int, disk=None):
        self.rank, self.disk = rank, disk
        self.salt = b""  # what rank 0's keys chain from (cache/tiers.salt)
        self.kv = OFF  # KV_BITS: how its blocks are kept (cache/kvbits.py)
        self.ram: dict[bytes, list] = {}
        self.staged: dict[bytes, list] = {}  # read back by a FETCH, for the next LOAD

    def ram_bytes(self) -> int:
        return sum(a.nbytes for layers in self.ram.values() for kv in layers for a in kv)

    def keep(self, lines: list[list[int]], block: int, span) -> None:
        """A SAVE's lines (row, tokens, start, ram, key...): drop the key where row is -1, else
        keep row `row`'s positions [start, start + block) (up to its `tokens`) as the block `key`:
        in RAM where `ram` says so, on this rank's disk where it holds none yet and the block is
        full. `span(row, tokens, start, end)` takes those positions of every layer."""
        kept, writes = [], []
        for row, n, start, ram, *ints in lines:
            key = key_of(ints)
            if row < 0:  # rank 0 evicts first, so the budget holds at every moment
                self.ram.pop(key, None)
                continue
            end = min(start + block, n)
            write = self.disk is not None and end - start == block and not self.disk.has(key)
            if not ram and not write:
                continue
            layers = self.kv.pack(span(row, n, start, end))
            kept.append(layers)
            if ram:
                self.ram[key] = layers
            if write:
                writes.append((key, layers))
        mx.eval(kept)  # copied now: the source cache may change or go next step
        for key, layers in writes:
            self.disk.put(key, to_record(layers))

    def fetch(self, lines: mx.array) -> mx.array:
        """A FETCH's lines (misses, key...), a chain of full blocks in order: bring the ones not in
        RAM back from disk for the next LOAD, and count a miss on every line from the first this
        rank (or a rank before it) cannot give."""
        self.staged.clear()
        rows = lines.tolist()
        keys = [key_of(r[1 : 1 + KEY_INTS]) for r in rows]
        missed = next((i for i, r in enumerate(rows) if r[0]), len(rows))
        have = 0
        while have < missed and keys[have] in self.ram:
            have += 1
        want = []
        for k in keys[have:missed]:
            if self.disk is None or not self.disk.has(k):
                break
            want.append(k)
        for k, record in zip(want, self.disk.get(want) if want else []):
            if record is None:
                break
            self.staged[k] = from_record(record)
            have += 1
        mine = [0] * have + [1] * (len(rows) - have)
        if self.staged:
            mx.eval(list(self.staged.values()))
        return mx.array([[m, *r[1:]] for m, r in zip(mine, rows)], dtype=mx.int32)

    def load(self, rows: list[list[list[int]]], n: int) -> list[list[tuple]]:
        """Each row's first `n` tokens from its blocks' keys, per layer, as (keys, values)."""
        out = []
        for keys in rows:
            blocks = []
            for ints in keys:
                key = key_of(ints)
                got = self.ram.get(key, self.staged.get(key))
                if got is None:
                    raise ProtocolError(
                        f"rank {self.rank}: prompt-cache block {key.hex()} is not held here "
                        "(rank 0's index and this rank's blocks differ)"
                    )
                blocks.append(got)
            layers = []
            for i in range(len(blocks[0])):
                parts = [b[i] for b in blocks]
                layers.append(
                    tuple(
                        mx.concatenate([p[j] for p in parts], axis=2)[..., :n, :]
                        for j in range(len(parts[0]))
                    )
                )
            out.append(self.kv.unpack(layers))
        self.staged.clear()
        return out

    def disk_figures(self) -> tuple[int, int, int]:
        """The status row's disk fields: blocks held, their KiB, KiB written since the start."""
        if self.disk is None:
            return 0, 0, 0
        st = self.disk.stats()
        return st["blocks"], st["bytes"] >> 10, (st["written_bytes"] >> 10) % 2**31
