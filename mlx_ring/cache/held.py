"""One rank's blocks of the prompt cache, for its own layers: the RAM tier (the blocks rank 0's
index says every rank holds), the blocks a FETCH brought back from this rank's disk for the LOAD
that follows it, and the writes to that disk. The SAVE, SAVE_ROW, FETCH and LOAD steps of
`shard.Shard` (cache/steps.py) drive it; only the engine thread calls it and makes or frees arrays:
the disk tier's threads see bytes, or read-only views of evaluated arrays' memory that the
engine thread lets go.
"""

import logging

import mlx.core as mx
import numpy as np
from mlx.utils import tree_map

from mlx_ring import gpu
from mlx_ring.cache.blocks import KEY_INTS, key_of
from mlx_ring.cache.kvbits import OFF
from mlx_ring.planning.probe import device_info
from mlx_ring.ring.protocol import ProtocolError

log = logging.getLogger(__name__)


def _flat(tree, name: str = ""):
    """(dotted path, array) for each array of nested tuples and lists: "layer.array", or
    "layer.part.array" where a layer's record has parts (cache/states.py)."""
    if not isinstance(tree, (tuple, list)):
        yield name, tree
        return
    for j, sub in enumerate(tree):
        yield from _flat(sub, f"{name}.{j}" if name else str(j))


def to_record(layers: list[tuple]):
    """A block's per-layer arrays (nested by part, for some models), evaluated, as the disk tier's
    record: read-only views of their memory, not copies, so that the writer's thread reads them
    (on CUDA, whose memory is managed, a first read from the host moves the pages: on the engine
    thread it held prefills back). `DiskTier` lets the views go on the engine thread."""
    from mlx_ring.cache.disk import Record

    arrays = {}
    for name, a in _flat(layers):
        view = memoryview(a)
        if view.c_contiguous:
            raw = view.cast("B").toreadonly()
        else:
            raw = np.array(a.view(mx.uint8)).tobytes()
        arrays[name] = (str(a.dtype).removeprefix("mlx.core."), tuple(a.shape), raw)
    return Record(arrays)


def from_record(record) -> list[tuple]:
    """The per-layer arrays of a block read back from disk, nested as they were kept."""
    tree: dict = {}
    for name, (dtype, shape, raw) in record.arrays.items():
        *path, last = map(int, name.split("."))
        node = tree
        for k in path:
            node = node.setdefault(k, {})
        u8 = np.frombuffer(raw, dtype=np.uint8).reshape(*shape[:-1], -1)
        node[last] = mx.array(u8).view(getattr(mx, dtype)).reshape(shape)

    def nested(node: dict) -> tuple:
        return tuple(nested(v) if isinstance(v, dict) else v for _, v in sorted(node.items()))

    return list(nested(tree))


def concat_layers(blocks: list[list[tuple]], n: int) -> list[tuple]:
    """Per layer, each of its arrays (keys, values) of consecutive blocks joined: the first `n`
    positions."""
    return [
        tuple(
            mx.concatenate([b[i][j] for b in blocks], axis=2)[..., :n, :]
            for j in range(len(blocks[0][i]))
        )
        for i in range(len(blocks[0]))
    ]


class HeldBlocks:
    """The blocks one rank holds, each a per-layer list of (keys, values) over its tokens (where
    not all layers keep plain KV caches, of each layer's parts: cache/states.py)."""

    def __init__(self, rank: int, disk=None):
        self.rank, self.disk = rank, disk
        # a block RAM keeps too goes to the disk as a copy of its own where the writer's reads
        # would move RAM's pages off the GPU
        self.disk_copy = gpu.host_reads_move_pages(device_info())
        self.salt = b""  # what rank 0's keys chain from (cache/tiers.salt)
        self.kv = OFF  # KV_BITS: how its blocks are kept (cache/kvbits.py)
        self.ram: dict[bytes, list] = {}
        # read back by a FETCH, for the next LOAD: one prompt's blocks past the RAM tier's (the
        # layer plan counts a prompt of KV_TOKENS tokens: planning/promptcache.py)
        self.staged: dict[bytes, list] = {}

    def ram_bytes(self) -> int:
        return sum(a.nbytes for layers in self.ram.values() for _, a in _flat(layers))

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
                own = ram and self.disk_copy
                writes.append((key, tree_map(mx.array, layers) if own else layers))
        # copied now: the source cache may change or go next step
        mx.eval(kept, [layers for _, layers in writes])
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

    def load(self, rows: list[list[list[int]]], n: int, join=concat_layers) -> list:
        """Each row's first `n` tokens from its blocks' keys, per layer, as (keys, values), or
        as `join(blocks, n)` makes them from the row's blocks' records."""
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
            out.append(self.kv.unpack(join(blocks, n)))
        self.staged.clear()
        return out

    def disk_figures(self) -> tuple[int, int, int]:
        """The status row's disk fields: blocks held, their KiB, KiB written since the start."""
        if self.disk is None:
            return 0, 0, 0
        st = self.disk.stats()
        return st["blocks"], st["bytes"] >> 10, (st["written_bytes"] >> 10) % 2**31
