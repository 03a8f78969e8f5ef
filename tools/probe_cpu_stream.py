"""What an evaluation on MLX's CPU stream costs the calling thread while the GPU is busy: a step
header's send on the ring backend (40 bytes) and a one-element CPU add, each with the GPU idle and
right after `mx.async_eval` of K chained (1, 8192) x (8192, 8192) bf16 products. Two ranks; rank 1
receives the headers. Run under mlx.launch:

    CUDA_PER_RANK=1 python tools/fed.py mlx.launch --backend ring --hostfile h2.json -- python tools/probe_cpu_stream.py [K]

Prints, on rank 0, the products' time alone and, per case, the median wall and CPU time (this
thread's) of the evaluation. On CUDA both waited for the products to finish, spinning
(docs/benchmarks.md: what it means for tensor mode's step headers, which travel on the ring backend).
"""

import sys
import time

from mlx_ring.gpu import one_gpu_per_rank

one_gpu_per_rank()  # before MLX starts

import mlx.core as mx  # noqa: E402

ROUNDS = 50


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

    header = lambda: mx.array(list(range(10)), dtype=mx.int32)  # noqa: E731
    cases = {"a header's send, GPU idle": False, "a header's send, GPU busy": True, "a CPU add, GPU busy": True}
    if w.rank() == 1:
        for _ in range(len(cases) * ROUNDS):
            mx.eval(mx.distributed.recv((10,), mx.int32, 0, group=w))
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


if __name__ == "__main__":
    main()
