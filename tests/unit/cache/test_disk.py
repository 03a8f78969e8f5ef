"""The prompt cache's disk tier on real files: blocks written once and read back after a restart,
every damaged or misplaced file refused and deleted, other scopes' and formats' folders deleted at
start (never a live one's), the cap kept by deleting least recently used blocks, and a full disk,
a failing write or a full queue skipping blocks while serving goes on. Each test waits for the
writer with close(), never with a sleep."""

import errno
import logging
import os
import shutil
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest

from mlx_ring.cache import blockfile, disk, scopes
from mlx_ring.cache.disk import FORMAT, DiskTier, Record

SCOPE = "5c09e0"
A, B, C, D = (bytes([n]) * 16 for n in (0xA1, 0xB2, 0xC3, 0xD4))


def record(seed: int, n: int = 1024) -> Record:
    return Record(
        {
            "keys": ("bfloat16", (1, 2, n // 4), bytes([seed]) * n),
            "values": ("float16", (n // 2,), bytes((seed + i) % 256 for i in range(n))),
        }
    )


def path(root: Path, key: bytes, scope: str = SCOPE) -> Path:
    return root / scope / key.hex()[:2] / f"{key.hex()}.kv"


@pytest.fixture
def opened(tmp_path):
    """Opens tiers under tmp_path (cap 1 GiB, no floor unless given) and closes them all after."""
    tiers = []

    def open_tier(scope: str = SCOPE, **kw) -> DiskTier:
        kw.setdefault("cap_bytes", 1 << 30)
        kw.setdefault("floor_bytes", 0)
        tiers.append(DiskTier(tmp_path, scope, **kw))
        return tiers[-1]

    yield open_tier
    for t in tiers:
        t.close()


def written(opened, *keys: bytes, **kw) -> int:
    """Write `keys` through one tier and close it; the size of one block's file."""
    t = opened(**kw)
    for key in keys:
        assert t.put(key, record(key[0]))
    t.close()
    assert t.stats()["blocks"] == len(keys)
    return t.stats()["bytes"] // len(keys)


def test_a_block_survives_a_restart(opened, tmp_path):
    t = opened()
    assert t.put(A, record(1)) and t.has(A) and not t.put(A, record(2))  # written once only
    t.close()
    assert path(tmp_path, A).is_file() and (tmp_path / SCOPE / "FORMAT").read_text() == str(FORMAT)
    size = path(tmp_path, A).stat().st_size
    assert t.stats()["written_bytes"] == size and t.stats()["writing"]

    again = opened()
    assert again.has(A) and not again.has(B) and not again.put(A, record(2))
    assert again.get([A, B, A]) == [record(1), None, record(1)]
    stats = again.stats()
    assert (stats["blocks"], stats["bytes"], stats["hits"], stats["misses"]) == (1, size, 2, 1)
    assert stats["read_bytes"] == 2 * size and stats["written_bytes"] == 0


def test_a_queued_block_is_held_and_served_from_the_queue(opened, tmp_path, held_writer):
    t = opened()
    assert t.put(A, record(1)) and t.has(A) and not path(tmp_path, A).exists()
    assert t.get([A]) == [record(1)] and t.stats()["read_bytes"] == 0
    assert t.stats()["queued_bytes"] == record(1).nbytes() == 2048
    held_writer.go.set()
    t.close()
    assert t.has(A) and path(tmp_path, A).is_file() and t.stats()["queued_bytes"] == 0


def test_the_queue_is_bounded(opened, tmp_path, held_writer):
    t = opened(queue_bytes=5000)
    assert t.put(A, record(1)) and t.put(B, record(2))
    assert not t.put(C, record(3)) and not t.has(C)  # 6144 bytes would be queued
    assert t.stats()["skipped"] == 1 and t.stats()["queued_bytes"] == 4096
    held_writer.go.set()
    t.close()
    assert [t.has(k) for k in (A, B, C)] == [True, True, False]


def test_close_is_bounded_and_drops_what_it_did_not_write(opened, tmp_path, held_writer):
    t = opened()
    assert t.put(A, record(1)) and t.put(B, record(2))
    assert held_writer.at.wait(60)
    t.close(timeout=0)  # the writer is held at A
    held_writer.go.set()
    t._writer.join(60)
    assert [t.has(k) for k in (A, B)] == [True, False] and t.stats()["skipped"] == 1
    assert not t.put(C, record(3))


def test_the_writer_never_lets_a_record_go_the_engine_threads_next_put_or_close_does(opened):
    # a record may view MLX's arrays, and only the engine thread frees them
    t, gone = opened(), []
    for key in (A, B):
        data = np.frombuffer(bytes(range(256)) * 4, dtype=np.uint8).copy()
        weakref.finalize(data, lambda: gone.append(threading.current_thread().name))
        assert t.put(key, Record({"raw": ("uint8", (1024,), memoryview(data).toreadonly())}))
        del data
    t.close()
    assert gone == [threading.current_thread().name] * 2 and t.stats()["queued_bytes"] == 0
    got = opened().get([A, B])
    assert [r.arrays["raw"][2] for r in got] == [bytes(range(256)) * 4] * 2


def truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:-10])


def flip_last(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[-1] ^= 1
    p.write_bytes(data)


def flip_header(p: Path) -> None:
    # a shape that still parses: only the header's own checksum catches it
    data = p.read_bytes()
    assert data.count(b"[1,2,256]") == 1
    p.write_bytes(data.replace(b"[1,2,256]", b"[1,2,257]"))


@pytest.mark.parametrize(
    "damage",
    [
        truncate,
        flip_last,
        flip_header,
        lambda p: p.write_bytes(b""),  # what a power cut can leave of an unsynced file
        lambda p: p.write_bytes(p.read_bytes() + b"\0"),
        lambda p: p.write_bytes(b"x" * 4096),
    ],
    ids=["truncated", "payload-byte", "header-byte", "empty", "longer", "garbage"],
)
def test_a_damaged_file_reads_as_a_miss_and_is_deleted(opened, tmp_path, damage, caplog):
    written(opened, A, B)
    damage(path(tmp_path, A))
    t = opened()
    assert t.get([A, B]) == [None, record(0xB2)]
    assert not path(tmp_path, A).exists() and not t.has(A) and t.has(B)
    stats = t.stats()
    assert (stats["corrupt"], stats["misses"], stats["hits"], stats["blocks"]) == (1, 1, 1, 1)
    assert "is corrupt" in caplog.text
    assert t.get([A]) == [None] and t.stats()["corrupt"] == 1  # not held any more


def test_a_file_renamed_onto_another_keys_name_is_refused(opened, tmp_path):
    written(opened, A, B)
    os.replace(path(tmp_path, A), path(tmp_path, B))
    t = opened()
    assert not t.has(A) and t.has(B)
    assert t.get([B]) == [None] and t.stats()["corrupt"] == 1 and not path(tmp_path, B).exists()


def test_the_header_names_the_key_scope_and_format_it_was_written_for():
    data = b"".join(blockfile.encode(A, SCOPE, record(1)))
    assert blockfile.decode(data, A, SCOPE) == record(1)
    with pytest.raises(blockfile.Corrupt, match="key"):
        blockfile.decode(data, B, SCOPE)
    with pytest.raises(blockfile.Corrupt, match="scope"):
        blockfile.decode(data, A, "07e7")
    assert Record({}).nbytes() == 0 and blockfile.decode(
        b"".join(blockfile.encode(A, SCOPE, Record({}))), A, SCOPE
    ) == Record({})


def test_scopes_sharing_a_root_never_see_each_others_blocks(opened, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mlx_ring.cache")
    first = opened("aa")
    assert first.put(A, record(1))
    first.close()
    first = opened("aa")  # live, holding its folder
    second = opened("bb")  # another rank on this machine: leaves the live folder alone
    assert not second.has(A) and second.get([A]) == [None] and first.get([A]) == [record(1)]
    assert second.put(A, record(2))
    second.close()
    assert first.get([A]) == [record(1)]
    first.close()

    third = opened("bb")  # the next start finds "aa" unheld: it is deleted
    assert not (tmp_path / "aa").exists() and not (tmp_path / "aa.lock").exists()
    assert third.get([A]) == [record(2)] and "of other scopes or formats" in caplog.text


def test_a_start_keeps_the_folders_of_its_own_family_and_deletes_other_families(opened, tmp_path):
    # the ranks of one ring on one machine start in any order: none deletes another's blocks
    rank0, rank1, other = "a" * 32 + "01", "a" * 32 + "02", "b" * 32 + "01"
    for scope, key in ((other, B), (rank1, A)):  # rank1's start deletes the other family
        tier = opened(scope)
        assert tier.put(key, record(1))
        tier.close()
    opened(rank0).close()
    assert (tmp_path / rank1).exists() and not (tmp_path / other).exists()
    assert opened(rank1).get([A]) == [record(1)]


def test_a_scope_owned_by_a_live_tier_is_only_read_by_a_second_one(opened):
    first = opened()
    assert first.put(A, record(1))
    first.close()
    first = opened()
    second = opened()
    assert second.get([A]) == [record(1)] and not second.put(B, record(2))
    assert not second.stats()["writing"] and first.put(B, record(2))


def test_folders_of_other_formats_and_leftovers_are_deleted_at_start(opened, tmp_path):
    written(opened, A)
    (tmp_path / SCOPE / "FORMAT").write_text(str(FORMAT - 1))  # as an older release wrote it
    old = tmp_path / "0f0f" / "a1"
    old.mkdir(parents=True)  # another scope, unlocked
    (old / f"{A.hex()}.kv").write_bytes(b"old")
    deleting = tmp_path / f"1e{scopes.DELETING}123-456" / "b2"
    deleting.mkdir(parents=True)  # a start killed while deleting it
    (deleting / "block").write_bytes(b"left")
    t = opened()
    assert not t.has(A) and not path(tmp_path, A).exists() and t.stats()["blocks"] == 0
    assert (tmp_path / SCOPE / "FORMAT").read_text() == str(FORMAT)
    assert sorted(p.name for p in tmp_path.iterdir()) == [SCOPE, f"{SCOPE}.lock"]


def test_kill_9_mid_write_leaves_nothing_that_loads(opened, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mlx_ring.cache")
    written(opened, A, B)
    # the writer killed while writing C's temporary file, and a power cut that kept B's name
    # but not all of its data
    whole = b"".join(blockfile.encode(C, SCOPE, record(3)))
    temp = path(tmp_path, C).with_name(path(tmp_path, C).name + ".tmp")
    temp.parent.mkdir()
    temp.write_bytes(whole[: len(whole) // 2])
    truncate(path(tmp_path, B))
    t = opened()
    assert not temp.exists() and not t.has(C) and "1 temporary files" in caplog.text
    assert t.get([A, B, C]) == [record(0xA1), None, None] and t.stats()["corrupt"] == 1


def test_the_cap_deletes_least_recently_used_blocks(opened, tmp_path):
    size = written(opened, A)
    t = opened(cap_bytes=3 * size)
    assert t.put(B, record(2)) and t.put(C, record(3))
    t.close()
    t = opened(cap_bytes=3 * size)
    assert t.get([A]) == [record(0xA1)]  # A is now the most recently used
    assert t.put(D, record(4))
    t.close()
    assert [t.has(k) for k in (A, B, C, D)] == [True, False, True, True]
    assert not path(tmp_path, B).exists() and t.stats()["bytes"] == 3 * size


def test_the_cap_at_start_goes_by_last_use(opened, tmp_path):
    size = written(opened, A, B, C)
    for n, key in enumerate((C, A, B)):  # oldest first, as mtimes say
        os.utime(path(tmp_path, key), (1000 + n, 1000 + n))
    t = opened(cap_bytes=3 * size)
    assert t.get([C]) == [record(0xC3)]  # touched: now the newest
    t.close()
    t = opened(cap_bytes=2 * size)
    assert [t.has(k) for k in (A, B, C)] == [False, True, True] and not path(tmp_path, A).exists()


def test_a_block_larger_than_the_cap_is_skipped(opened):
    size = written(opened, A, scope="e0")  # the scope's length is the header's
    fits, over = opened("e1", cap_bytes=size), opened("e2", cap_bytes=size - 1)
    assert fits.put(D, record(4)) and over.put(D, record(4))  # its payload alone is under both
    fits.close()
    over.close()
    assert fits.has(D) and not over.has(D) and over.stats()["skipped"] == 1
    assert not over.put(A, Record({"big": ("uint8", (size,), bytes(size))}))


def test_below_the_floor_nothing_is_written_and_serving_goes_on(opened, tmp_path, caplog):
    written(opened, A)
    t = opened(floor_bytes=2 * shutil.disk_usage(tmp_path).total)
    assert t.put(B, record(2)) and t.put(C, record(3))
    t.close()
    assert not t.has(B) and not path(tmp_path, B).exists() and t.get([A]) == [record(0xA1)]
    stats = t.stats()
    assert (stats["skipped"], stats["written_bytes"], stats["writing"]) == (2, 0, False)
    assert caplog.text.count("under the floor") == 1


def test_the_default_floor_leaves_a_share_of_the_file_system(opened, tmp_path):
    total = shutil.disk_usage(tmp_path).total
    t = opened(floor_bytes=None)
    assert t.floor == max(20 << 30, int(0.10 * total))


def test_a_failing_write_stops_writes_once_and_serving_goes_on(
    opened, tmp_path, monkeypatch, caplog
):
    written(opened, A)

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk.os, "replace", full)
    t = opened()
    assert t.put(B, record(2)) and t.put(C, record(3))
    t.close()
    stats = t.stats()
    assert not t.has(B) and not t.has(C) and (stats["skipped"], stats["writing"]) == (2, False)
    assert caplog.text.count("writing stopped") == 1 and "No space left" in caplog.text
    assert not list((tmp_path / SCOPE).rglob("*.tmp"))  # its temporary file went with it
    assert not t.put(D, record(4)) and t.stats()["skipped"] == 3
    assert t.get([A]) == [record(0xA1)]


def test_an_unusable_root_serves_nothing_and_raises_nothing(tmp_path, caplog):
    root = tmp_path / "a-file"
    root.write_text("")
    t = DiskTier(root, SCOPE, 1 << 30, floor_bytes=0)
    assert not t.put(A, record(1)) and t.get([A]) == [None] and not t.stats()["writing"]
    t.close()
    assert "serving without it" in caplog.text


def test_keys_and_scopes_are_checked_at_the_edge(opened, tmp_path):
    t = opened()
    with pytest.raises(ValueError, match="16 bytes"):
        t.has(b"short")
    with pytest.raises(ValueError, match="16 bytes"):
        t.get([A, A.hex().encode()])
    with pytest.raises(ValueError, match="lowercase hex"):
        DiskTier(tmp_path, "ABCD", 1 << 30)
