"""A rank's slice of the model, and the step protocol that carries work around the ring.

Every step travels as a fixed-size int32 header, then (if its shape is not empty) one payload
array: hidden states `(B, L, H)` for a prefill or decode step (a lone prompt's prefill chunk goes
back to rank 0 as its last position only, `(1, 1, H)`), the rows' right padding `(B,)` for a join
step, the kept row indices `(k,)` for a filter step, a `(size, STATUS_COLS)` table for a status
step. The same `Shard.apply` runs a step on every rank, rank 0 included, so the KV caches of all
ranks go through the same operations in the same order.
"""

import ctypes
import json
import logging
import os
import resource
import select
import socket
import stat
import time
import zlib
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_attention_mask
from mlx_lm.generate import _merge_caches
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache
from mlx_lm.utils import load_model

from plan import LayerPlan

log = logging.getLogger(__name__)

HEADER_LEN = 9
DTYPES = (mx.float32, mx.float16, mx.bfloat16, mx.int32)
# Status row: rank, MLX active KiB, MLX peak KiB, RSS KiB, open sequences, cached tokens, step us,
# KV-cache KiB now, KV-cache KiB at most so far.
STATUS_COLS = 9
# A decode group's cache grows by this many token-rows at a time (mlx-lm's fixed 256 tokens a row
# left 64 rows holding 4x the tokens they had, and growing copies the whole cache).
GROUP_SPARE_TOKENS = 256


class Kind(IntEnum):
    PREFILL = 1  # run local layers on a chunk `(B, L, H)` of prefill batch `seq`, with that batch's own cache
    JOIN = 2  # move prefill batch `seq`'s cache (payload: its rows' right padding) into group `group`, as its last rows
    DECODE = 3  # run local layers on group `group`'s batch `(B, 1, H)`, with the group's batched cache
    FILTER = 4  # keep only the rows of group `group` listed in the int32 payload `(k,)`
    FREE = 5  # drop the cache of prefill batch `seq` (it will not join)
    STATUS = 6  # each rank fills its row of the payload table
    PING = 7  # no-op round trip: proves every rank is alive and in step
    SHUTDOWN = 8  # pass it on, then exit


@dataclass(frozen=True)
class Header:
    kind: int
    seq: int = 0
    offset: int = 0  # PREFILL: tokens already in the cache of batch `seq`; 0 starts a fresh cache
    shape: tuple[int, ...] = ()  # payload shape, at most 3 dims; () means no payload
    dtype: int = 0  # index into DTYPES
    group: int = 0  # JOIN, DECODE, FILTER: the decode group (micro-batch) the step acts on

    def encode(self) -> mx.array:
        dims = list(self.shape) + [0] * (3 - len(self.shape))
        return mx.array([self.kind, self.seq, self.offset, self.dtype, self.group, len(self.shape), *dims], dtype=mx.int32)

    @staticmethod
    def decode(a: mx.array) -> "Header":
        kind, seq, offset, dtype, group, ndim, *dims = a.tolist()
        return Header(Kind(kind), seq, offset, tuple(dims[:ndim]), dtype, group)

    @staticmethod
    def for_payload(kind: int, payload: mx.array, seq: int = 0, offset: int = 0, group: int = 0) -> "Header":
        return Header(kind, seq, offset, tuple(payload.shape), DTYPES.index(payload.dtype), group)

    def same_step(self, other: "Header") -> bool:
        """The same step, whatever payload it carries now."""
        return (self.kind, self.seq, self.offset, self.group) == (other.kind, other.seq, other.offset, other.group)


def init_group(socket_buffer: int = 0) -> mx.distributed.Group:
    """The ring group mlx.launch describes; a group of one when started alone. `socket_buffer`:
    if set, the kernel send and receive buffers of the ring's sockets, in bytes (small ones model
    a real link's, for tests)."""
    # mlx.launch's output threads spin on a rank's stdin pipe while it is writable (a core per rank on
    # a small machine); with our end closed, its next write fails and it stops watching the pipe.
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    before = _socket_fds()
    hostfile = os.environ.get("MLX_HOSTFILE")
    if hostfile and os.path.isfile(hostfile) and not Path(hostfile).read_text().strip():
        # mlx.launch writes an empty ring description for a one-host hostfile: nothing to join.
        del os.environ["MLX_HOSTFILE"]
    group = mx.distributed.init(backend="ring")
    rank, size = group.rank(), group.size()
    # The sockets to the previous rank: those it connected to this rank's own ring ports and, in a
    # ring of two, where it is the next rank too, those this rank connected to it (MLX's ring
    # backend may use either direction's sockets between the same two ranks).
    mine = _ring_ports(rank) if size > 1 else set()
    theirs = _ring_ports((rank + 1) % size) if size == 2 else set()
    _PREV_FDS[:] = [fd for fd, local, peer in _ring_sockets(_socket_fds() - before, socket_buffer)
                    if local in mine or peer in theirs]
    _share_cores(group)
    return group


def _ring_sockets(fds: set[int], buffer: int) -> list[tuple[int, int, int]]:
    """(fd, local port, peer port) of each connected socket among `fds`; sets its buffers if `buffer`."""
    out = []
    for fd in sorted(fds):
        with socket.socket(fileno=os.dup(fd)) as s:  # a duplicate: closing it leaves `fd` open
            try:
                peer = s.getpeername()[1]
            except OSError:
                continue  # the listening socket
            if buffer:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
            out.append((fd, s.getsockname()[1], peer))
    return out


def _ring_ports(rank: int) -> set[int]:
    # mlx.launch's ring description: per rank, the "ip:port" addresses it listens on.
    with open(os.environ["MLX_HOSTFILE"]) as f:
        return {int(address.rsplit(":", 1)[1]) for address in json.load(f)[rank]}


def _share_cores(group: mx.distributed.Group) -> None:
    """Ranks on one host split its cores between their BLAS thread pools: oversubscribed pools spin
    against each other (2 ranks on 2 cores decoded 1.5x slower with a pool of 2 each)."""
    me = zlib.crc32(socket.gethostname().encode()) & 0x7FFFFFFF
    hosts = mx.distributed.all_gather(mx.array([me], dtype=mx.int32), group=group).tolist()
    local = hosts.count(me)
    set_threads = getattr(ctypes.CDLL(None), "openblas_set_num_threads", None)  # OpenBLAS, when preloaded
    if local > 1 and set_threads is not None:
        set_threads(max(1, (os.cpu_count() or 1) // local))


# The sockets the ring backend opened from the previous rank (see Ring.recv). Filled by init_group.
_PREV_FDS: list[int] = []


def _socket_fds() -> set[int]:
    fds = set()
    for name in os.listdir("/dev/fd"):
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                fds.add(int(name))
        except OSError:
            pass
    return fds



class Ring:
    """Point-to-point links to the ring neighbours: receive from rank-1, send to rank+1 (mod size)."""

    def __init__(self, group: mx.distributed.Group):
        self.group = group
        self.rank, self.size = group.rank(), group.size()
        self.next, self.prev = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        self.unread = False  # a payload's recv was handed out lazily and its data not yet waited for
        # Wait for a payload in the kernel only on a CPU device, where MLX's polling thread takes a
        # core from the stage itself. On a GPU, evaluating at once queues the stage's kernels while
        # the data is on its way (waiting first cost 1 ms a token on 2 x H200), at the price of a
        # polling core while a peer computes, or when it stopped mid-step.
        self.wait_in_kernel = mx.default_device() == mx.cpu

    def send(self, header: Header, payload: mx.array | None) -> None:
        """Pass a step on: its header, then its payload (computed within the send's graph)."""
        self.send_header(header, payload)
        self.send_payload(payload)

    def send_header(self, header: Header, payload: mx.array | None) -> None:
        if payload is not None:  # the header tells the payload actually sent (the last rank trims a prefill's)
            header = Header.for_payload(header.kind, payload, header.seq, header.offset, header.group)
        # Evaluated on its own, before the payload: two independent sends in one graph have no order.
        mx.eval(mx.distributed.send(header.encode(), self.next, group=self.group))

    def send_payload(self, payload: mx.array | None) -> None:
        if payload is not None and payload.ndim:
            self.wait_payload()  # this payload may be computed from one still to arrive
            mx.eval(mx.distributed.send(payload, self.next, group=self.group))

    def recv(self, lazy: bool = False) -> tuple[Header, mx.array | None]:
        """The next step from the previous rank. `lazy`: the payload of a forward step (hidden
        states) is left in the graph, for a caller that calls `wait_payload()` and then evaluates
        it (with what it computes from it) before the next recv; `send_payload` does both. Other
        steps' payloads are read on the host when applied, so they always arrive here. (Building
        a forward step's graph must not read its input: the wait would then find no data coming.)"""
        self._wait_for_data()
        # The header tells the payload's shape and dtype, so it must arrive first.
        header = Header.decode(mx.distributed.recv((HEADER_LEN,), mx.int32, self.prev, group=self.group))
        if not header.shape:
            return header, None
        payload = mx.distributed.recv(header.shape, DTYPES[header.dtype], self.prev, group=self.group)
        self.unread = True
        if not (lazy and header.kind in (Kind.PREFILL, Kind.DECODE)):
            self.wait_payload()
            mx.eval(payload)
        return header, payload

    def wait_payload(self) -> None:
        """Block until the payload of the last lazy `recv` starts to arrive (at once if it has)."""
        if self.unread and self.wait_in_kernel:
            self._wait_for_data()
        self.unread = False

    def _wait_for_data(self) -> None:
        # MLX's ring thread busy-polls its sockets while a recv is pending, a whole core per waiting
        # rank (for a whole stage of the previous rank, when a header came and its payload is still
        # being computed); wait for data, or a closed peer, in the kernel first, at no cost. Only the
        # previous rank's sockets: the next rank's, once that rank is gone, would wake this at once.
        if _PREV_FDS:
            select.select(_PREV_FDS, [], [])


def rss_kib() -> int:
    """Resident memory of this process now (Linux), or its peak where /proc is missing (macOS)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() >> 10
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10  # bytes on macOS


def _check_architecture(model: nn.Module) -> nn.Module:
    inner = getattr(model, "model", None)
    if inner is None or not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm")):
        raise ValueError(
            f"model type {getattr(model, 'model_type', type(model).__name__)!r} does not have the "
            "embed_tokens / layers / norm shape this server slices; use a Llama, Mistral, Qwen2, Qwen3 or Phi-3 family model"
        )
    return inner


def parameter_bytes(module: nn.Module) -> int:
    return sum(v.nbytes for _, v in tree_flatten(module.parameters()))


class Shard:
    """The layers `[start, end)` of one rank and their KV caches, and (rank 0) embedding and head.

    Caches live in two places: one per prefill batch while its prompts are prefilled (a lone prompt's
    exactly as a single process would hold it, several prompts' as one right-padded batch), then, once
    it joins a decode group, as rows of that group's batched, left-padded cache (mlx-lm's
    `BatchKVCache`), so the whole group decodes in one forward step.
    """

    def __init__(self, model: nn.Module, plan: LayerPlan, rank: int):
        self.model, self.plan, self.rank = model, plan, rank
        self.inner = model.model
        self.start, self.end = plan.ranges[rank]
        self.last = rank == len(plan.ranges) - 1  # hands steps back to rank 0
        self.prefills: dict[int, list] = {}  # prefill batch -> per-layer caches
        self.groups: dict[int, list] = {}  # group -> per-layer batched caches
        # Moving average, on workers, of the time from a forward step's header to passing it on: this
        # rank's stage plus any wait for the payload (which arrives inside the stage's graph).
        self.forward_us = 0.0
        self.kv_peak = 0  # most bytes the KV caches held at once
        self.host = socket.gethostname()

    # -- rank 0 only: the ends of the model -------------------------------------------------------
    def embed(self, tokens: mx.array) -> mx.array:
        return self.inner.embed_tokens(tokens)

    def head(self, h: mx.array) -> mx.array:
        h = self.inner.norm(h)
        if "lm_head" in self.model:
            return self.model.lm_head(h)
        return self.inner.embed_tokens.as_linear(h)

    # -- every rank ---------------------------------------------------------------------------------
    def forward(self, h: mx.array, caches: list, causal: bool = False) -> mx.array:
        """Run the local layers on hidden states `(B, L, H)`. `causal`: a fresh batch of right-padded
        prompts, where padding only follows a row's tokens, so the plain causal mask is exact."""
        masks = {}
        for layer, c in zip(self.inner.layers, caches):
            window = self.inner.sliding_window if getattr(layer, "use_sliding", False) else None
            if window not in masks:
                # The batch cache's own mask is an array: on CUDA a masked attention kernel is built
                # for each new batch shape (seconds of stalls under load); "causal" needs none.
                masks[window] = "causal" if causal and window is None else create_attention_mask(h, c, window_size=window)
            h = layer(h, masks[window], c)
        return h

    @staticmethod
    def rows(caches: list | None) -> int:
        """Rows of a batch's caches (a lone prompt's cache has one)."""
        if not caches:
            return 0
        return caches[0].offset.shape[0] if isinstance(caches[0].offset, mx.array) else 1

    def apply(self, header: Header, payload: mx.array | None) -> mx.array | None:
        """Apply one step to this rank's layers and caches; returns the payload to pass on."""
        kind = header.kind
        if kind == Kind.PREFILL:
            B, L = payload.shape[:2]
            if header.offset == 0:
                caches = make_prompt_cache(self.model)
                if B > 1:  # prompts prefilled together: one batch cache, as mlx-lm's batch generator makes
                    caches = _merge_caches([caches] + [make_prompt_cache(self.model) for _ in range(B - 1)])
                for c in caches:
                    c.step = L  # sized to the chunk: no spare room (a long prompt grows a chunk at a time)
                self.prefills[header.seq] = caches
            caches = self.prefills.get(header.seq)
            assert caches is not None, f"rank {self.rank}: no cache for prefill batch {header.seq}"
            assert caches[0].size() == header.offset, (
                f"rank {self.rank}: cache of prefill batch {header.seq} holds {caches[0].size()} tokens, "
                f"rank 0 expects {header.offset}"
            )
            assert B == 1 or header.offset == 0, "a batch of several prompts is prefilled in one chunk"
            out = self.forward(payload, caches, causal=B > 1)
            self.kv_bytes()  # the caches grew while the graph was built
            if self.last and B == 1:
                out = out[:, -1:, :]  # rank 0 needs only a lone prompt's last position (it has no padding)
            return out
        if kind == Kind.DECODE:
            rows = self.rows(self.groups.get(header.group))
            assert rows == payload.shape[0], f"rank {self.rank}: group {header.group} has {rows} rows, step has {payload.shape[0]}"
            caches = self.groups[header.group]
            size = caches[0].nbytes
            out = self.forward(payload, caches)
            if caches[0].nbytes != size:  # grew (every few steps): only then can the peak move
                self.kv_bytes()
            return out
        if kind == Kind.JOIN:
            joining = self.prefills.pop(header.seq)
            padding = payload.tolist()
            if len(padding) == 1:
                joining = [c.merge([c]) for c in joining]  # a lone prompt's cache becomes a batch of one
            else:
                for c in joining:  # right padding moves to the left, where decoding expects it
                    c.prepare(right_padding=padding)
                    c.finalize()
            group = self.groups.get(header.group)
            if group is None:
                self.groups[header.group] = group = joining
            else:
                for g, b in zip(group, joining):
                    if isinstance(g, BatchKVCache):  # drop its spare room: extend pads all rows to the larger one
                        keys, values, offset, left, used = g.state
                        g.state = keys[..., :used, :], values[..., :used, :], offset, left, used
                    g.extend(b)
            self._size_growth(group)
            return payload  # the next rank needs the same padding
        if kind == Kind.FILTER:
            keep = payload.tolist() if payload is not None else []
            if keep:
                for c in self.groups[header.group]:
                    c.filter(keep)
                self._size_growth(self.groups[header.group])
            else:
                del self.groups[header.group]
                mx.clear_cache()  # hand freed cache memory back, so memory stays flat between bursts
            return payload  # the next rank needs the same row list
        if kind == Kind.FREE:
            self.prefills.pop(header.seq, None)
            mx.clear_cache()
            return None
        if kind == Kind.STATUS:
            row = mx.array([self.status_row()], dtype=mx.int32)
            return mx.concatenate([payload[: self.rank], row, payload[self.rank + 1 :]])
        return payload

    @staticmethod
    def _size_growth(caches: list) -> None:
        # Few rows grow in mlx-lm's steps of 256 tokens (fewer copies); many rows in smaller ones.
        step = max(16, GROUP_SPARE_TOKENS // Shard.rows(caches))
        for c in caches:
            c.step = step

    def kv_bytes(self) -> int:
        """Bytes the KV caches hold now (allocated, spare room included); updates the peak."""
        now = sum(c.nbytes for caches in (*self.prefills.values(), *self.groups.values()) for c in caches)
        self.kv_peak = max(self.kv_peak, now)
        return now

    def status_row(self) -> list[int]:
        rows = tokens = 0
        for caches in (*self.prefills.values(), *self.groups.values()):
            rows += self.rows(caches)
            tokens += int(mx.maximum(caches[0].offset, 0).sum().item())  # an int or one per row
        return [self.rank, mx.get_active_memory() >> 10, mx.get_peak_memory() >> 10, rss_kib(), rows, tokens,
                int(self.forward_us), self.kv_bytes() >> 10, self.kv_peak >> 10]

    def info(self) -> dict:
        return {
            "rank": self.rank,
            "host": self.host,
            "layers": [self.start, self.end],
            "parameter_bytes": parameter_bytes(self.model),
            "holds_embedding": "embed_tokens" in self.inner,
            "holds_head": "norm" in self.inner,
        }


def load_shard(model_path: Path, plan: LayerPlan, rank: int) -> Shard:
    """Build the model lazily, keep only this rank's layers (and, on rank 0, embedding, norm and head),
    then materialise what is left: tensors of other ranks are never read from disk."""
    model, _ = load_model(Path(model_path), lazy=True)
    inner = _check_architecture(model)
    if len(inner.layers) != plan.n_layers:
        raise ValueError(f"the plan is for {plan.n_layers} layers but the model has {len(inner.layers)}")
    start, end = plan.ranges[rank]
    inner.layers = inner.layers[start:end]
    if rank != 0:
        for name in ("embed_tokens", "norm"):
            inner.pop(name)
        if "lm_head" in model:
            model.pop("lm_head")
    mx.eval(model.parameters())
    return Shard(model, plan, rank)


def serve_worker(shard: Shard, ring: Ring) -> None:
    """Ranks 1..N-1: apply each step that arrives, pass it on, until a shutdown step goes by."""
    while True:
        # The next step, from the previous rank; its payload arrives within the graph that computes on
        # it and sends the result on (one sync per step instead of two; every payload is consumed).
        header, payload = ring.recv(lazy=True)
        t0 = time.perf_counter()
        out = shard.apply(header, payload)
        ring.send(header, out)  # on to the next rank; the last rank sends back to rank 0
        if header.kind in (Kind.PREFILL, Kind.DECODE):
            shard.forward_us = 0.9 * shard.forward_us + 0.1 * (time.perf_counter() - t0) * 1e6
        if header.kind == Kind.SHUTDOWN:
            return
