"""A rank's slice of the model: its layers and KV caches, the steps of the protocol applied to
them (`mlx_ring.ring.protocol`; the prompt cache's steps come from `mlx_ring.cache.steps`), and its
loading. The loop of the ranks after rank 0, which receives each step, applies it here and sends it
on, is `mlx_ring.ring.worker`'s.

The same `Shard.apply` runs a step on every rank, rank 0 included, so the KV caches of all ranks go
through the same operations in the same order.
"""

import json
import socket
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model

from mlx_ring.cache.held import HeldBlocks
from mlx_ring.cache.states import Kept, slice_state_bytes
from mlx_ring.cache.steps import CacheSteps
from mlx_ring.hosts.weights import MANIFEST, missing_pieces, pieces_for
from mlx_ring.models.compat import (
    UNFUSED_PREFILL_KEYS,
    UNFUSED_SEVERAL,
    block_cacheable,
    drop_spare_room,
    lone_group,
    merge_caches,
    positions,
    trim_rows,
    unfused_attention,
)
from mlx_ring.models.slicing import Slice, lone_row_masks, share_offsets
from mlx_ring.models.support import UNBATCHED, check_supported
from mlx_ring.planning.growth import growth_step
from mlx_ring.planning.plan import LayerPlan
from mlx_ring.platform import resident_bytes
from mlx_ring.ring.protocol import Header, Kind, ProtocolError, StatusRow
from mlx_ring.tensor.cut import split_model


def rss_kib() -> int:
    """Resident memory of this process now, in KiB (Linux and macOS alike)."""
    return resident_bytes() >> 10


def parameter_bytes(module: nn.Module) -> int:
    return sum(v.nbytes for _, v in tree_flatten(module.parameters()))


class Shard(CacheSteps):
    """The layers `[start, end)` of one rank and their KV caches, and (rank 0) embedding and head.

    Caches live in two places: one per prefill batch while its prompts are prefilled (a lone
    prompt's exactly as a single process would hold it, several prompts' as one right-padded batch),
    then, once it joins a decode group, as rows of that group's batched, left-padded cache (mlx-lm's
    `BatchKVCache`), so the whole group decodes in one forward step.
    """

    def __init__(
        self,
        cut: Slice,
        plan: LayerPlan,
        rank: int,
        plain_kv: bool = False,
        batches: bool = True,
        world: mx.distributed.Group | None = None,
    ):
        self.slice, self.model, self.plan, self.rank, self.world = cut, cut.model, plan, rank, world
        # Every layer's cache (not only this slice's) is a plain KV cache: it can be
        # saved and reused by prefix, drop rejected drafts, and take right padding out
        # after a batch's prefill.
        self.plain_kv = plain_kv
        self.batches = batches  # the layers take several rows at once (else one row a decode group)
        self.start, self.end = plan.ranges[plan.stage_of(rank)]
        # every rank a share of every layer, the step's all_sums joining them
        self.tensor = plan.tensor > 1
        # its output is rank 0's (the last rank's, or every rank's)
        self.last = plan.stage_of(rank) == len(plan.ranges) - 1
        self.prefills: dict[int, list] = {}  # prefill batch -> per-layer caches
        self.groups: dict[int, list] = {}  # group -> per-layer batched caches
        # prompt-cache blocks: per-layer (keys, values) of their tokens (cache/held.py)
        self.held = HeldBlocks(rank)
        # Tokens a block holds, as every rank's config says (0: no prompt cache). Layers not all
        # plain KV caches keep blocks too where they can (`cacheable`): each prefill batch notes
        # its states at every block boundary for its SAVE (cache/states.py).
        self.block, self.cacheable = 0, plain_kv or block_cacheable(cut.protos)
        self.kept: dict[int, Kept] = {}
        self.state_bytes = 0  # of the fixed states a block keeps beside its positions (-1: unknown)
        self.prefill_tokens = 0  # token positions run through prefill steps (status)
        # Moving average, on workers, of the time from a forward step's header to passing it on:
        # this rank's stage plus any wait for the payload (which arrives inside the stage's graph).
        self.forward_us = 0.0
        self.busy_s = 0.0  # time spent running steps (workers: from a step's arrival to its send)
        self.kv_peak = 0  # most bytes the KV caches held at once
        self.host = socket.gethostname()
        self._steps = {
            Kind.PREFILL: self._prefill,
            Kind.DECODE: self._decode,
            Kind.JOIN: self._join,
            Kind.FILTER: self._filter,
            Kind.FREE: self._free,
            Kind.STATUS: self._status,
            Kind.LOAD: self._load,
            Kind.SAVE: self._save,
            Kind.SAVE_ROW: self._save_row,
            Kind.TRIM: self._trim,
            Kind.FETCH: self._fetch,
        }

    # -- rank 0 only: the ends of the model -------------------------------------------------------
    def embed(self, tokens: mx.array) -> mx.array:
        return self.slice.embed(tokens)

    def head(self, h: mx.array) -> mx.array:
        return self.slice.head(h)

    # -- every rank
    # ---------------------------------------------------------------------------------
    @staticmethod
    def rows(caches: list | None) -> int:
        """Rows of a batch's caches (a lone prompt's cache has one)."""
        if not caches:
            return 0
        seen = positions(caches)
        if seen is None:
            return caches[0].batch_size
        return seen.shape[0] if isinstance(seen, mx.array) else 1

    def apply(self, header: Header, payload: mx.array | None) -> mx.array | None:
        """Apply one step to this rank's layers and caches; returns the payload to pass on. A
        forward step comes as token ids `(B, L)` to a rank whose layers start at 0 (the first
        stage embeds), else as hidden states `(B, L, H)`."""
        step = self._steps.get(header.kind)
        return step(header, payload) if step is not None else payload  # PING, SHUTDOWN: passed on

    def _prefill(self, header: Header, payload: mx.array) -> mx.array:
        B, L = payload.shape[:2]
        if header.offset == 0:
            caches = self.slice.new_caches()
            # prompts prefilled together: one batch cache, as mlx-lm's batch generator makes
            if B > 1:
                # merging empty caches only counts them: no copy per row
                caches = merge_caches([caches] * B)
            self.prefills[header.batch] = caches
        caches = self.prefills.get(header.batch)
        if caches is None:
            raise ProtocolError(f"rank {self.rank}: no cache for prefill batch {header.batch}")
        for c in caches:
            # grows by the chunk: no spare room, which a batch's padding would roll in at its join
            c.step = L
        # a batch's (one per row) would need a sync
        seen = positions(caches) if B == 1 else header.offset
        if seen not in (None, header.offset):
            raise ProtocolError(
                (
                    f"rank {self.rank}: cache of prefill batch {header.batch} holds {seen} tokens, "
                    f"rank 0 expects {header.offset}"
                )
            )
        # see compat
        with unfused_attention(UNFUSED_SEVERAL and header.offset + L <= UNFUSED_PREFILL_KEYS):
            out = self.slice.forward(payload, caches, fresh_batch=B > 1)
        self.prefill_tokens += B * L
        self.kv_bytes()  # the caches grew while the graph was built
        if self.block and not self.plain_kv and self.cacheable:
            kept = self.kept.setdefault(header.batch, Kept(self.rank, self.block))
            # with the step, not apart: its payload may arrive within its graph (transport.recv)
            if pieces := kept.take(caches, header.offset, L):
                out = mx.depends(out, pieces)
        if self.last and B == 1:
            # rank 0 needs only a lone prompt's last position (it has no padding)
            out = out[:, -1:, :]
        return out

    def _decode(self, header: Header, payload: mx.array) -> mx.array:
        rows = self.rows(self.groups.get(header.group))
        if rows != payload.shape[0]:
            raise ProtocolError(
                (
                    f"rank {self.rank}: group {header.group} has {rows} rows, step "
                    f"has {payload.shape[0]}"
                )
            )
        caches = self.groups[header.group]
        if header.offset:  # drafts every row rejected in the group's last step
            for c in caches:
                c.trim(header.offset)
        size = caches[0].nbytes
        with unfused_attention(payload.shape[1] > 1 and UNFUSED_SEVERAL):  # verifying drafts
            # token ids on the first stage: its forward embeds them
            out = self.slice.forward(payload, caches)
        share_offsets(caches)
        if caches[0].nbytes != size:  # grew (every few steps): only then can the peak move
            self.kv_bytes()
        return out

    def _join(self, header: Header, payload: mx.array) -> mx.array:
        joining = self.prefills.pop(header.batch)
        self.kept.pop(header.batch, None)
        padding = payload.tolist()
        if len(padding) == 1:
            joining = lone_group(joining)  # a lone prompt's caches become a batch of one
        else:
            for c in joining:  # right padding moves to the left, where decoding expects it
                c.prepare(right_padding=padding)
                c.finalize()
        group = self.groups.get(header.group)
        if group is None:
            self.groups[header.group] = group = joining
        else:
            for g, b in zip(group, joining):
                drop_spare_room(g)
                g.extend(b)
        lone_row_masks(group)
        self._size_growth(group)
        return payload  # the next rank needs the same padding

    def _filter(self, header: Header, payload: mx.array | None) -> mx.array | None:
        keep = payload.tolist() if payload is not None else []
        if keep:
            for c in self.groups[header.group]:
                c.filter(keep)
            self._size_growth(self.groups[header.group])
        else:
            del self.groups[header.group]
            mx.clear_cache()  # hand freed cache memory back, so memory stays flat between bursts
        return payload  # the next rank needs the same row list

    def _trim(self, header: Header, payload: mx.array) -> mx.array:
        drops = payload.tolist()
        for c in self.groups[header.group]:
            trim_rows(c, drops)
        return payload  # the next rank drops the same

    def _free(self, header: Header, payload: None) -> None:
        self.prefills.pop(header.batch, None)
        self.kept.pop(header.batch, None)
        mx.clear_cache()

    def _status(self, header: Header, table: mx.array) -> mx.array:
        mine = mx.concatenate(
            [table[: self.rank], self.status_row().array(), table[self.rank + 1 :]]
        )
        # no table goes round: every rank fills its row of a zero table, and one all_sum joins them
        if self.tensor:
            return mx.distributed.all_sum(mine, group=self.world)
        return mine

    @staticmethod
    def _size_growth(caches: list) -> None:
        step = growth_step(Shard.rows(caches))
        for c in caches:
            c.step = step

    def count(self, header: Header, took: float) -> None:
        """A step's `took` seconds on this rank, for the status: busy time, and
        a forward step's average."""
        self.busy_s += took
        if header.kind in (Kind.PREFILL, Kind.DECODE):
            self.forward_us = 0.9 * self.forward_us + 0.1 * took * 1e6

    def kv_bytes(self) -> int:
        """Bytes the KV caches hold now (allocated, spare room included); updates the peak."""
        now = sum(
            c.nbytes for caches in (*self.prefills.values(), *self.groups.values()) for c in caches
        )
        self.kv_peak = max(self.kv_peak, now)
        return now

    def status_row(self) -> StatusRow:
        rows = tokens = 0
        for caches in (*self.prefills.values(), *self.groups.values()):
            rows += self.rows(caches)
            seen = positions(caches)
            # an int or one per row
            tokens += int(mx.maximum(seen, 0).sum().item()) if seen is not None else 0
        return StatusRow(
            self.rank,
            mx.get_active_memory() >> 10,
            mx.get_peak_memory() >> 10,
            rss_kib(),
            rows,
            tokens,
            int(self.forward_us),
            self.kv_bytes() >> 10,
            self.kv_peak >> 10,
            int(self.busy_s * 100) % 2**31,
            len(self.held.ram),
            self.held.ram_bytes() >> 10,
            self.prefill_tokens % 2**31,
            *self.held.disk_figures(),
        )

    def info(self) -> dict:
        return {
            "rank": self.rank,
            "host": self.host,
            "layers": [self.start, self.end],
            "parameter_bytes": parameter_bytes(self.model),
            "holds_embedding": "embed_tokens" in self.slice.owner,
            # the final norm and an output projection: its own, or the embedding used as one (tied)
            "holds_head": "norm" in self.slice.owner
            and ("lm_head" in self.model or "embed_tokens" in self.slice.owner),
            "state_bytes": self.state_bytes,
        }


def load_shard(
    model_path: Path, plan: LayerPlan, rank: int, world: mx.distributed.Group | None = None
) -> Shard:
    """Build the model lazily, keep only this rank's layers (and, on rank 0, embedding, norm
    and head), then materialise what is left: tensors of other ranks are never read from
    disk. A folder the launcher sent holds only this host's pieces; it must hold all of this
    rank's. In tensor mode (`plan.tensor` > 1, `world` the ranks sharing the layers) every
    rank keeps its share of every layer, and the whole embedding and head (rank 0 runs the
    head; the others only embed)."""
    start, end = plan.ranges[plan.stage_of(rank)]
    tensor = plan.tensor > 1
    lacking = missing_pieces(model_path, pieces_for(range(start, end), rank == 0 or tensor))
    if lacking:
        raise ValueError(
            f"{model_path} lacks {', '.join(lacking[:4])} of this rank's layers [{start}, {end}); "
            "start the ring with ./launch.sh, which sends every host the pieces of its slice"
        )
    hosted = (Path(model_path) / MANIFEST).is_file()
    # before mlx-lm builds anything
    check_supported(json.loads((Path(model_path) / "config.json").read_text()))
    model, config = load_model(Path(model_path), lazy=True, strict=not hosted)
    if len(model.layers) != plan.n_layers:
        raise ValueError(
            f"the plan is for {plan.n_layers} layers but the model has {len(model.layers)}"
        )
    if tensor:
        assert world is not None and world.size() == plan.tensor, (
            "tensor mode needs the world of its ranks"
        )
        # before the cut: the slice's caches are made for this rank's heads
        split_model(model, world)
    cut = Slice(model, start, end, ends=rank == 0 or tensor)
    # only the slice's tensors (and rank 0's ends) are still in the model
    mx.eval(model.parameters())
    # the peak the status reports is serving's: loading comes before any cache
    mx.reset_peak_memory()
    shard = Shard(
        cut,
        plan,
        rank,
        cut.plain_kv,
        batches=config.get("model_type") not in UNBATCHED,
        world=world,
    )
    if shard.cacheable and not shard.plain_kv:
        shard.state_bytes = slice_state_bytes(cut, config)
    return shard
