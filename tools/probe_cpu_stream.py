"""What an evaluation on MLX's CPU stream costs the calling thread while the GPU is busy: a step
header's send on the ring backend (40 bytes) and a one-element CPU add, each with the GPU idle and
right after `mx.async_eval` of K chained (1, 8192) x (8192, 8192) bf16 products. Two ranks; rank 1
receives the headers. Then the send handed to `mx.async_eval` instead: how long the call takes, and
how late the header reaches rank 1; and rank 1's receive of a header (sent at once) while its own
GPU is busy. Each with the evaluated output dropped at once or kept until the GPU is idle: MLX's
CUDA backend frees a CPU-stream event's managed memory with `cudaFree`, which may wait for the
device, and keeping the output keeps its event. Run under mlx.launch:

    CUDA_PER_RANK=1 python tools/fed.py mlx.launch --backend ring --hostfile h2.json -- python tools/probe_cpu_stream.py [K]

Prints, on rank 0, the products' time alone and, per case, the median wall and CPU time (the
timing thread's) of the evaluation (for the asynchronous sends, of the `mx.async_eval` call, and
the header's median lag from that call to its arrival on rank 1, both ranks on one host's clock).
On CUDA the send and the add with the GPU busy waited for the products to finish, spinning; an
asynchronous send whose output was kept reached rank 1 in 0.96 ms, one whose output was dropped
3.9 s late (docs/benchmarks.md: what it means for tensor mode's step headers, which travel on the
ring backend).
"""

import sys
import time
from functools import partial
from statistics import median

from mlx_ring.gpu import one_gpu_per_rank

one_gpu_per_rank()  # before MLX starts

import mlx.core as mx  # noqa: E402

ROUNDS = 50
WINDOW_US = 100_000_000  # header stamps: microseconds within a 100 s window (an int32)


def stamp() -> int:
    return int(time.time() * 1e6) % WINDOW_US


def timed(fn) -> tuple[float, float]:
    """`fn()`'s wall time and this thread's CPU time, in seconds."""
    t, c = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - t, time.thread_time() - c


def medians(times: list[tuple[float, float]]) -> tuple[float, float]:
    """The median wall and CPU time of `timed` results, in milliseconds."""
    return median(t[0] for t in times) * 1e3, median(t[1] for t in times) * 1e3


def main() -> None:
    w = mx.distributed.init(backend="ring")
    if w.size() != 2:
        raise SystemExit("probe_cpu_stream.py needs exactly two ranks (a hostfile of two entries)")
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    m = (mx.random.normal((8192, 8192)) * 0.01).astype(mx.bfloat16)
    x = mx.random.normal((1, 8192)).astype(mx.bfloat16)
    mx.eval(m, x)

    def work() -> mx.array:
        y = x
        for _ in range(k):
            y = y @ m
        return y

    header = lambda: mx.array([stamp()] + list(range(9)), dtype=mx.int32)  # noqa: E731
    send = lambda: mx.distributed.send(header(), 1, group=w)  # noqa: E731
    one = mx.array([1.0])
    # Each case: whether the GPU is busy first, what is evaluated (a header goes to rank 1 every round),
    # and whether its output is kept until the GPU is idle.
    cases = {"a header's send, GPU idle": (False, send, False), "a header's send, GPU busy": (True, send, False),
             "a header's send, GPU busy, its output kept": (True, send, True),
             "a CPU add, GPU busy": (True, lambda: mx.add(one, one, stream=mx.cpu), False)}
    later = ["async_eval of a header's send, GPU busy, its output dropped",
             "async_eval of a header's send, GPU busy, its output kept"]
    receives = ["rank 1's receive of a header, its GPU busy", "rank 1's receive of a header, its GPU busy, its output kept"]
    if w.rank() == 1:
        for _ in range(len(cases) * ROUNDS):
            mx.eval(mx.distributed.recv((10,), mx.int32, 0, group=w))
        for _ in later:
            lags = []
            for _ in range(ROUNDS):
                got = mx.distributed.recv((10,), mx.int32, 0, group=w)
                mx.eval(got)
                lags.append((stamp() - got[0].item()) % WINDOW_US / 1e3)
            mx.eval(mx.distributed.send(mx.array([median(lags)]), 0, group=w))  # rank 0 prints it
        for case in receives:  # rank 0 sends at once, its GPU idle: a slow receive waits on rank 1's GPU
            times, kept = [], []
            for _ in range(ROUNDS):
                y = work()
                mx.async_eval(y)
                got = mx.distributed.recv((10,), mx.int32, 0, group=w)
                times.append(timed(lambda: mx.eval(got)))
                if case.endswith("kept"):
                    kept.append(got)
                del got
                mx.eval(y)
            kept.clear()
            mx.eval(mx.distributed.send(mx.array(medians(times)), 0, group=w))
        return
    mx.eval(work())
    alone = median(timed(lambda: mx.eval(work()))[0] for _ in range(ROUNDS))
    print(f"{k} products alone: {alone * 1e3:.3f} ms", flush=True)
    for case, (busy, make, keep) in cases.items():
        times, queued = [], []
        for _ in range(ROUNDS):
            y = work() if busy else None
            queued.append(timed(lambda: y is not None and mx.async_eval(y))[0])
            out = make()
            times.append(timed(lambda: mx.eval(out)))
            if not keep:
                del out
            if y is not None:
                mx.eval(y)
            out = None  # a kept output goes now, the GPU idle
            if make is not send:
                mx.eval(send())  # rank 1 takes a header every round
        wall, cpu = medians(times)
        print(f"{case}: wall {wall:.3f} ms, CPU {cpu:.3f} ms (after async_eval of the products, {median(queued) * 1e3:.3f} ms)",
              flush=True)
    for case in later:
        times, kept = [], []
        for _ in range(ROUNDS):
            y = work()
            mx.async_eval(y)
            sent = send()
            times.append(timed(partial(mx.async_eval, sent)))
            if case.endswith("kept"):
                kept.append(sent)
            del sent
            mx.eval(y)
        kept.clear()  # the GPU is idle now
        lag = mx.distributed.recv((1,), mx.float32, 1, group=w).item()
        wall, cpu = medians(times)
        print(f"{case}: the call {wall:.3f} ms, CPU {cpu:.3f} ms; the header reached rank 1 {lag:.3f} ms after the call",
              flush=True)
    for case in receives:
        for _ in range(ROUNDS):
            mx.eval(send())
        wall, cpu = mx.distributed.recv((2,), mx.float32, 1, group=w).tolist()  # rank 1's medians, ms
        print(f"{case}: wall {wall:.3f} ms, CPU {cpu:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
