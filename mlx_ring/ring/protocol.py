"""The step protocol: what travels round the ring, and the status row every rank fills.

Every step travels as a fixed-size int32 header, then (if its shape is not empty) one payload array:
hidden states `(B, L, H)` for a prefill or decode step (a lone prompt's prefill chunk goes back to
rank 0 as its last position only, `(1, 1, H)`), or its token ids `(B, L)` where the next rank's
layers start at 0 (tensor mode: every rank embeds them), the rows' right padding `(B,)` for a join
step, the kept row indices `(k,)` for a filter step, the keys of each row's prompt-cache blocks
`(B, k, 4)` for a load step, `(k, 8)` lines of (row, tokens, start, ram, key) for a save step,
`(k, 5)` lines of (misses, key) for a fetch step, the positions each row drops `(B,)` for a trim
step, a `(size, len(StatusRow))` table for a status step. No Python objects cross the wire. A
tensor step built on token ids still being sampled carries none: its header says the ids come
within the step (`summed`), in an all_sum of rank 0's ids and the other ranks' zeros.
"""

from dataclasses import astuple, dataclass, fields
from enum import IntEnum

import mlx.core as mx

HEADER_LEN = 10
DTYPES = (mx.float32, mx.float16, mx.bfloat16, mx.int32)


class Kind(IntEnum):
    # run local layers on a chunk `(B, L, H)` of prefill batch `batch`, with that batch's own cache
    PREFILL = 1
    # move prefill batch `batch`'s cache (payload: its rows' right padding) into group `group`, as
    # its last rows
    JOIN = 2
    # drop every row's last `offset` positions, then run local layers on group `group`'s
    # batch `(B, L, H)`
    DECODE = 3
    FILTER = 4  # keep only the rows of group `group` listed in the int32 payload `(k,)`
    FREE = 5  # drop the cache of prefill batch `batch` (it will not join)
    STATUS = 6  # each rank fills its row of the payload table
    PING = 7  # no-op round trip: proves every rank is alive and in step
    SHUTDOWN = 8  # pass it on, then exit
    # start prefill batch `batch`'s cache, row i as the first `offset` tokens of the
    # prompt-cache blocks payload[i] (their keys, in order)
    LOAD = 9
    # for each payload line (row, n, start, ram, key): keep positions [start, start + offset)
    # (up to n) of row `row` of prefill batch `batch` (which holds n tokens) as block `key`, in
    # RAM where `ram` is 1, on disk where full; drop block `key` where row is -1; line by line
    SAVE = 10
    SAVE_ROW = 11  # the same for rows of decode group `group` (sequences leaving it)
    # drop the last payload[i] positions of row i of group `group` (drafts the target rejected)
    TRIM = 12
    # bring the chain of full blocks payload[:, 1:] back from each rank's disk for the next LOAD;
    # each rank counts, in payload[:, 0], a miss on every line from the first it cannot give
    FETCH = 13


class ProtocolError(RuntimeError):
    """What another rank sent breaks the step protocol: the ring cannot go on."""


@dataclass(frozen=True)
class Header:
    kind: int
    batch: int = 0  # PREFILL, JOIN, FREE, LOAD, SAVE: the prefill batch the step acts on
    # PREFILL: tokens already in the cache of batch `batch` (0 starts a fresh one); LOAD: tokens;
    # SAVE, SAVE_ROW: tokens a block holds; DECODE: positions every row drops first (rejected
    # drafts: a TRIM folded into the next step)
    offset: int = 0
    shape: tuple[int, ...] = ()  # payload shape, at most 3 dims; () means no payload
    dtype: int = 0  # index into DTYPES
    # JOIN, DECODE, FILTER, SAVE_ROW, TRIM: the decode group (micro-batch) the step acts on
    group: int = 0
    # DECODE in tensor mode: the token ids `shape` come in an all_sum within the step,
    # not on the wire
    summed: int = 0

    @property
    def carried(self) -> bool:
        """Whether a payload follows this header on the wire."""
        return bool(self.shape) and not self.summed

    def ints(self) -> tuple[int, ...]:
        """The header's HEADER_LEN fields as they go on the wire."""
        dims = list(self.shape) + [0] * (3 - len(self.shape))
        return (
            int(self.kind),
            self.batch,
            self.offset,
            self.dtype,
            self.group,
            self.summed,
            len(self.shape),
            *dims,
        )

    def encode(self) -> mx.array:
        return mx.array(self.ints(), dtype=mx.int32)

    @staticmethod
    def decode(a: mx.array) -> "Header":
        """A header another rank sent; ProtocolError when it cannot be one (checked
        under `python -O` too)."""
        return Header.parse(tuple(a.tolist()))

    @staticmethod
    def parse(values: tuple[int, ...]) -> "Header":
        """`decode` of the fields as ints."""
        kind, batch, offset, dtype, group, summed, ndim, *dims = values
        if (
            kind not in Kind._value2member_map_
            or not 0 <= ndim <= 3
            or not 0 <= dtype < len(DTYPES)
            or min(dims[:ndim], default=0) < 0
            or summed not in (0, 1)
        ):
            raise ProtocolError(
                (
                    f"a step header that no rank sends: {list(values)} (the ranks run different "
                    "versions, or the stream is corrupt)"
                )
            )
        return Header(Kind(kind), batch, offset, tuple(dims[:ndim]), dtype, group, summed)

    @staticmethod
    def for_payload(
        kind: int, payload: mx.array, batch: int = 0, offset: int = 0, group: int = 0
    ) -> "Header":
        return Header(kind, batch, offset, tuple(payload.shape), DTYPES.index(payload.dtype), group)

    def same_step(self, other: "Header") -> bool:
        """The same step, whatever payload it carries now."""
        return (self.kind, self.batch, self.offset, self.group) == (
            other.kind,
            other.batch,
            other.offset,
            other.group,
        )


@dataclass(frozen=True)
class StatusRow:
    """One rank's live figures, as an int32 row of the STATUS step's table (KiB
    keep bytes in int32)."""

    rank: int
    mlx_active_memory_kib: int
    mlx_peak_memory_kib: int
    rss_kib: int
    open_sequences: int
    cached_tokens: int
    forward_us: int  # workers: moving average of a forward step's time on this rank
    kv_cache_kib: int
    kv_cache_peak_kib: int
    # hundredths of a second this rank spent running steps since it started (wraps after 248 days)
    busy_cs: int
    # prompt-cache blocks this rank keeps in RAM for its layers (cache/blocks.py)
    prompt_cache_entries: int
    prompt_cache_kib: int
    # token positions this rank has run prefill steps on since it started (wraps at 2^31)
    prefill_tokens: int
    # its disk tier: blocks held, their KiB, KiB written since it started (wraps at 2^31)
    disk_blocks: int = 0
    disk_kib: int = 0
    disk_written_kib: int = 0

    @staticmethod
    def table(size: int) -> mx.array:
        """The empty table a STATUS step carries round the ring: one row per rank."""
        return mx.zeros((size, len(fields(StatusRow))), dtype=mx.int32)

    @staticmethod
    def parse(table: mx.array) -> list[dict]:
        return [StatusRow(*row).__dict__ for row in table.tolist()]

    def array(self) -> mx.array:
        return mx.array([astuple(self)], dtype=mx.int32)
