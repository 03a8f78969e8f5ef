"""What an evaluation on MLX's CPU stream costs the calling thread while the GPU is busy: a step
header's send on the ring backend (40 bytes) and a one-element CPU add, each with the GPU idle and
right after `mx.async_eval` of K chained (1, 8192) x (8192, 8192) bf16 products. Two ranks; rank 1
receives the headers. Then the send handed to `mx.async_eval` instead, its output dropped at once or
kept until the GPU is idle: how long the call takes, and how late the header reaches rank 1 (MLX's
CUDA backend frees a CPU-stream event's managed memory with `cudaFree`, which may wait for the
device; keeping the output keeps its event). Run under mlx.launch:

    CUDA_PER_RANK=1 python tools/fed.py mlx.launch --backend ring --hostfile h2.json -- python tools/probe_cpu_stream.py [K]

Prints, on rank 0, the products' time alone and, per case, the median wall and CPU time (this
thread's) of the evaluation (for the asynchronous sends, of the `mx.async_eval` call, and the
header's median lag from that call to its arrival on rank 1, both ranks on one host's clock). On CUDA both waited for the products to finish, spinning
(docs/benchmarks.md: what it means for tensor mode's step headers, which travel on the ring backend).
"""

import sys
import time

from mlx_ring.gpu import one_gpu_per_rank

one_gpu_per_rank()  # before MLX starts

import mlx.core as mx  # noqa: E402

ROUNDS = 50
WINDOW_US = 100_000_000  # header stamps: microseconds within a 100 s window (an int32)


def stamp() -> int:
    return int(time.time() * 1e6) % WINDOW_US


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


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
    cases = {"a header's send, GPU idle": False, "a header's send, GPU busy": True, "a CPU add, GPU busy": True}
    later = ["async_eval of a header's send, GPU busy, its output dropped",
             "async_eval of a header's send, GPU busy, its output kept"]
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
        return
    mx.eval(work())
    alone = []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        mx.eval(work())
        alone.append(time.perf_counter() - t)
    print(f"{k} products alone: {median(alone) * 1e3:.3f} ms", flush=True)
    for case, busy in cases.items():
        walls, cpus, queued = [], [], []
        for _ in range(ROUNDS):
            y = work() if busy else None
            t = time.perf_counter()
            if y is not None:
                mx.async_eval(y)
            queued.append(time.perf_counter() - t)
            h, a = header(), mx.array([1.0])
            t, c = time.perf_counter(), time.thread_time()
            if case.startswith("a CPU add"):
                mx.eval(mx.add(a, a, stream=mx.cpu))
            else:
                mx.eval(mx.distributed.send(h, 1, group=w))
            walls.append(time.perf_counter() - t)
            cpus.append(time.thread_time() - c)
            if y is not None:
                mx.eval(y)
            if case.startswith("a CPU add"):
                mx.eval(mx.distributed.send(h, 1, group=w))  # rank 1 takes a header every round
        print(f"{case}: wall {median(walls) * 1e3:.3f} ms, CPU {median(cpus) * 1e3:.3f} ms "
              f"(after async_eval of the products, {median(queued) * 1e3:.3f} ms)", flush=True)
    for case in later:
        walls, cpus, kept = [], [], []
        for _ in range(ROUNDS):
            y = work()
            mx.async_eval(y)
            t, c = time.perf_counter(), time.thread_time()
            sent = mx.distributed.send(header(), 1, group=w)
            mx.async_eval(sent)
            walls.append(time.perf_counter() - t)
            cpus.append(time.thread_time() - c)
            if case.endswith("kept"):
                kept.append(sent)
            del sent
            mx.eval(y)
        kept.clear()  # the GPU is idle now
        lag = mx.distributed.recv((1,), mx.float32, 1, group=w).item()
        print(f"{case}: the call {median(walls) * 1e3:.3f} ms, CPU {median(cpus) * 1e3:.3f} ms; "
              f"the header reached rank 1 {lag:.3f} ms after the call", flush=True)


if __name__ == "__main__":
    main()
