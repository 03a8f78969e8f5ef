"""Tensor mode's loop of the ranks after rank 0: each step passed on first, then run with every
rank at once, joined by its all_sums, each within a deadline."""

import logging
import time

import mlx.core as mx

from mlx_ring.ring.control import BEAT_S
from mlx_ring.ring.protocol import Header, Kind
from mlx_ring.ring.transport import PeerSilent, Ring
from mlx_ring.ring.worker import WorkerStage, leave_on_sigterm
from mlx_ring.tensor.lockstep import RankLeft, StepWatch, summed_ids

log = logging.getLogger("shard")  # a worker's lines name the shard it runs

WORKER_GRACE_S = 5.0


def serve_tensor(
    shard: WorkerStage, ring: Ring, drain_timeout: float = 30.0, step_timeout: float = 60.0
) -> None:
    """Ranks 1..N-1 in tensor mode, until a shutdown step goes by (a SIGTERM as in the pipeline:
    ring/worker.py). The step (header and input: token ids or a small table) comes from rank 0
    on the control link (control.py), on the host; every rank then meets the step's all_sums.
    Each step done is counted on the link, whose beats tell rank 0."""
    leave_on_sigterm(ring, drain_timeout)
    # Rank 0 times each step too, and names the failure to the clients: a worker's deadline comes a
    # little later, for a rank 0 that is itself gone or stuck.
    watch = StepWatch(shard.rank, step_timeout + WORKER_GRACE_S)
    # A decode step stays queued on the device while the next step comes and is built (as rank 0
    # and mlx-lm's loop do). Other steps are evaluated at once: a prefill chunk's intermediates are
    # not held twice.
    link = ring.link
    queued: tuple[Header, mx.array] | None = None
    while True:
        # no step within a beat: the ring is idle, and the queued step is done (the beats say so)
        if queued is not None and not link.coming(BEAT_S):
            mx.eval(queued[1])
            ring.mark("done", queued[0])
            link.completed()
            queued = None
        try:
            header, payload = ring.recv()
        except PeerSilent as e:
            log.warning("leaving: %s", e)
            return
        except RuntimeError as e:  # the control link lost, or out of step
            raise RankLeft(f"rank {shard.rank}: the ring broke while a step came: {e}") from e
        if header.kind == Kind.SHUTDOWN:
            watch.stop()  # every rank leaves now: closing sockets are no fault
            link.stop()
        t0 = time.perf_counter()
        with watch.step(header):
            if header.summed:
                # rank 0's sampled ids, within the step's graph
                payload = summed_ids(header, None, shard.world)
            out = shard.apply(header, payload)
            ring.mark("built", header)
            if out is not None:
                mx.async_eval(out)  # joins the step's all_sums with every other rank
            if queued is not None:  # the last decode step, now that this one is queued behind it
                mx.eval(queued[1])
                ring.mark("done", queued[0])
                link.completed()
            queued = (header, out) if out is not None and header.kind == Kind.DECODE else None
            if queued is None:
                if out is not None:
                    mx.eval(out)
                ring.mark("done", header)
                link.completed()
        shard.count(header, time.perf_counter() - t0)
        if header.kind == Kind.SHUTDOWN:
            return
