"""What one hop of the ring costs on this machine's device, apart from any model: two ranks pass a
message back and forth (a round trip is two hops), alone and with K chained GPU matmuls (a stage of
K x 0.06-0.1 ms on an H100 or H200) between receiving and sending, the evaluations split five ways
(the ring computes a stage "f(recv) evaluated, then send" on CUDA, else in one graph). Run under
mlx.launch with two ranks:

    python tools/fed.py mlx.launch --backend ring --hostfile h2.json -- python tools/probe_hop.py [K ...]
    (CUDA_PER_RANK=1 in the environment on a multi-GPU host: a GPU per rank)

Prints, on rank 0, for each K the stage alone (evaluated on its own, one rank) and, for each way, the
median round trip and what a hop adds to a stage: half the round trip less the stage alone.
"""

import sys
import time

from mlx_ring.gpu import one_gpu_per_rank

one_gpu_per_rank()  # before MLX starts

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

HIDDEN = 8192  # one row of a 70B-shaped model's hidden state
ROUNDS = 200

WAYS = ["one graph: send(f(recv))", "recv evaluated, then send(f(y))", "f(recv) evaluated, then send",
        "recv, f and send each evaluated", "recv started, then f(recv) evaluated, then send"]


def median_ms(fn, rounds: int = ROUNDS) -> float:
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[rounds // 2] * 1e3


def main() -> None:
    w = mx.distributed.init(backend="ring")
    if w.size() != 2:
        raise SystemExit("probe_hop.py needs exactly two ranks (a hostfile of two entries)")
    works = [int(k) for k in sys.argv[1:]] or [1]
    r, peer = w.rank(), 1 - w.rank()
    x = mx.random.normal((1, 1, HIDDEN)).astype(mx.bfloat16)
    lin = nn.Linear(HIDDEN, HIDDEN, bias=False)
    lin.set_dtype(mx.bfloat16)
    mx.eval(x, lin.parameters())
    send = lambda a: mx.distributed.send(a, peer, group=w)  # noqa: E731
    recv = lambda: mx.distributed.recv_like(x, peer, group=w)  # noqa: E731
    say = (lambda s: print(s, flush=True)) if r == 0 else (lambda s: None)

    def f(y: mx.array, k: int) -> mx.array:
        for _ in range(k):
            y = lin(y) * 0.01  # scaled, so k chained products stay finite
        return y

    def stage(way: str, y: mx.array, k: int) -> None:
        if way == "message":
            mx.eval(y)
            mx.eval(send(x))
        elif way == WAYS[0]:
            mx.eval(send(f(y, k)))
        elif way == WAYS[1]:
            mx.eval(y)
            mx.eval(send(f(y, k)))
        elif way == WAYS[2]:
            z = f(y, k)
            mx.eval(z)
            mx.eval(send(z))
        elif way == WAYS[4]:
            mx.async_eval(y)  # the GPU stream, not this thread, waits for the data
            z = f(y, k)
            mx.eval(z)
            mx.eval(send(z))
        else:
            z = f(y, k)  # built before the data comes, evaluated after
            mx.eval(y)
            mx.eval(z)
            mx.eval(send(z))

    def round_trip(way: str, k: int) -> None:
        if r == 0:
            stage(way, x, k)  # rank 0 starts the round from its own input
            mx.eval(recv())
        else:
            stage(way, recv(), k)

    say(f"message only: round trip {median_ms(lambda: round_trip('message', 0)):.3f} ms")
    for k in works:
        alone = median_ms(lambda: mx.eval(f(x, k)))
        say(f"K={k}: the stage alone, evaluated on its own: {alone:.3f} ms")
        for way in WAYS:
            rt = median_ms(lambda: round_trip(way, k))
            say(f"K={k}: {way}: round trip {rt:.3f} ms, a hop adds {rt / 2 - alone:.3f} ms to a stage")


if __name__ == "__main__":
    main()
