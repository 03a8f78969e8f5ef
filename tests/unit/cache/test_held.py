"""One rank's blocks (cache/held.py): kept in RAM and written to its disk once, brought back by a
FETCH after a restart, loaded as the first tokens of a prompt; a spoilt file counts as a miss."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_ring.cache.blocks import chain_keys, key_ints
from mlx_ring.cache.disk import DiskTier
from mlx_ring.cache.held import HeldBlocks

B = 4  # tokens a block holds
KEYS = chain_keys(list(range(8)), b"salt", B)  # two full blocks


def span_of(kv):
    """SAVE's `span` over one row's per-layer (keys, values) of shape (1, heads, tokens, dim)."""
    return lambda row, n, start, end: [tuple(a[:, :, start:end, :] for a in pair) for pair in kv]


def layers(seed: int):
    mx.random.seed(seed)
    return [tuple(mx.random.normal((2, 1, 2, 8, 3))) for _ in range(3)]  # 3 layers, 8 tokens


def lines(ram: int):
    return [[0, 8, i * B, ram, *key_ints(k)] for i, k in enumerate(KEYS)]


def fetched(held, keys):
    rows = mx.array([[0, *key_ints(k)] for k in keys], dtype=mx.int32)
    return held.fetch(rows)[:, 0].tolist()


def test_blocks_written_once_come_back_after_a_restart_and_load_as_the_prompts_start(tmp_path):
    disk = DiskTier(tmp_path, "ab", 1 << 30, floor_bytes=0)
    held, kv = HeldBlocks(0, disk), layers(0)
    held.keep(lines(ram=1), B, span_of(kv))
    held.keep(lines(ram=0), B, span_of(kv))  # a second prompt with the same start: no rewrite
    disk.close()
    assert disk.stats()["blocks"] == 2 and len(held.ram) == 2
    written = disk.stats()["written_bytes"]

    disk = DiskTier(tmp_path, "ab", 1 << 30, floor_bytes=0)  # a restart: RAM is empty
    held = HeldBlocks(0, disk)
    assert fetched(held, KEYS) == [0, 0] and disk.stats()["written_bytes"] == 0
    [got] = held.load([[key_ints(k) for k in KEYS]], 7)
    for (k, v), (want_k, want_v) in zip(got, kv):
        np.testing.assert_array_equal(np.array(k), np.array(want_k[:, :, :7, :]))
        np.testing.assert_array_equal(np.array(v), np.array(want_v[:, :, :7, :]))
    assert held.staged == {} and written > 0


def test_a_spoilt_block_and_every_one_after_it_count_as_misses(tmp_path):
    disk = DiskTier(tmp_path, "ab", 1 << 30, floor_bytes=0)
    HeldBlocks(0, disk).keep(lines(ram=0), B, span_of(layers(1)))
    disk.close()
    first = next(tmp_path.rglob(KEYS[0].hex() + ".kv"))
    first.write_bytes(first.read_bytes()[:-3])
    held = HeldBlocks(0, DiskTier(tmp_path, "ab", 1 << 30, floor_bytes=0))
    assert fetched(held, KEYS) == [1, 1] and held.staged == {}


def address(buffer) -> int:
    return np.frombuffer(buffer, dtype=np.uint8).__array_interface__["data"][0]


@pytest.mark.parametrize("moves", [True, False], ids=["cuda", "shared memory"])
def test_a_block_ram_keeps_goes_to_the_disk_as_a_view_copied_only_where_reads_move_pages(
    tmp_path, held_writer, moves
):
    # on CUDA the writer's reads would move RAM's pages off the GPU; on Metal they move nothing
    disk = DiskTier(tmp_path, "ab", 1 << 30, floor_bytes=0)
    held = HeldBlocks(0, disk)
    held.disk_copy = moves
    kv = layers(2)

    def compact(row, n, start, end):  # as SAVE's spans are
        return [tuple(mx.contiguous(a) for a in pair) for pair in span_of(kv)(row, n, start, end)]

    held.keep(lines(ram=1), B, compact)
    [queued] = disk.get(KEYS[:1])  # the writer is held: from the queue
    raw, ram = queued.arrays["0.0"][2], memoryview(held.ram[KEYS[0]][0][0]).cast("B")
    assert isinstance(raw, memoryview) and raw.readonly and raw == ram
    assert (address(raw) != address(ram)) == moves
    held_writer.go.set()
    disk.close()
    assert disk.stats()["blocks"] == 2
