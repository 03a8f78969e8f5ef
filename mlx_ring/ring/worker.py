"""The pipeline's loop of the ranks after rank 0: each step that arrives applied to the rank's shard
and passed on, until a shutdown step goes by (tensor mode's loop: tensor/worker.py)."""

import logging
import signal
import time
from typing import Protocol

import mlx.core as mx

from mlx_ring.ring.handle import Stage
from mlx_ring.ring.protocol import Header, Kind
from mlx_ring.ring.transport import PeerSilent, Ring

log = logging.getLogger("shard")  # a worker's lines name the shard it runs


class WorkerStage(Stage, Protocol):
    """A worker's shard as its loop sees it (`shard.Shard`)."""

    rank: int
    tensor: bool  # a share of every layer: every rank runs each step at once
    world: mx.distributed.Group | None  # the ranks of the step's all_sums (tensor mode)

    def count(self, header: Header, took: float) -> None: ...


def leave_on_sigterm(ring: Ring, drain_timeout: float) -> None:
    """A SIGTERM alone would cut the ring under requests rank 0 is still draining: it only starts
    the clock on a silent predecessor. Rank 0 drains for at most `drain_timeout`, so a silence that
    long means no drain is going on (rank 0 stopped, or its host is gone)."""
    signal.signal(
        signal.SIGTERM,
        lambda *_: (
            log.info("SIGTERM: leaving when rank 0 shuts the ring down"),
            ring.terminate(drain_timeout),
        ),
    )


def serve_worker(
    shard: WorkerStage, ring: Ring, drain_timeout: float = 30.0, step_timeout: float = 60.0
) -> None:
    """Ranks 1..N-1 of a pipeline: apply each step that arrives, pass it on, until a shutdown step
    goes by, or a SIGTERM came and the previous rank has been silent for `drain_timeout` seconds
    since. (`step_timeout`: tensor mode's, which the pipeline's ring watches by its own beats.)"""
    leave_on_sigterm(ring, drain_timeout)
    while True:
        # The next step, from the previous rank; a forward step's payload arrives within the
        # graph that computes on it and sends the result on (one sync per step instead of two;
        # every payload is consumed), except where the ring receives it apart first (every
        # forward step on Metal: Ring.apart).
        try:
            header, payload = ring.recv(lazy=True)
        except PeerSilent as e:
            log.warning("leaving: %s", e)
            return
        t0 = time.perf_counter()
        out = shard.apply(header, payload)
        ring.mark("built", header)
        ring.send(header, out)  # on to the next rank; the last rank sends back to rank 0
        if ring.control is not None:
            ring.control.completed()  # the next beat tells rank 0: a worker stuck is named
        shard.count(header, time.perf_counter() - t0)
        if header.kind == Kind.SHUTDOWN:
            return
