"""What one hop of the ring costs on this machine's device, apart from any model: two ranks pass a
message back and forth (a round trip is two hops), alone and with a GPU matmul between receiving and
sending, the evaluations split four ways. Run under mlx.launch with two ranks:

    python tools/fed.py mlx.launch --backend ring --hostfile h2.json -- python tools/probe_hop.py
    (CUDA_PER_RANK=1 in the environment on a multi-GPU host: a GPU per rank)

Prints, on rank 0, the median round trip of each way.
"""

import time

from mlx_ring.gpu import one_gpu_per_rank

one_gpu_per_rank()  # before MLX starts

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

HIDDEN = 8192  # one row of a 70B-shaped model's hidden state


def main() -> None:
    w = mx.distributed.init(backend="ring")
    if w.size() != 2:
        raise SystemExit("probe_hop.py needs exactly two ranks (a hostfile of two entries)")
    r, peer = w.rank(), 1 - w.rank()
    x = mx.random.normal((1, 1, HIDDEN)).astype(mx.bfloat16)
    lin = nn.Linear(HIDDEN, HIDDEN, bias=False)
    lin.set_dtype(mx.bfloat16)
    mx.eval(x, lin.parameters())
    send = lambda a: mx.distributed.send(a, peer, group=w)  # noqa: E731
    recv = lambda: mx.distributed.recv_like(x, peer, group=w)  # noqa: E731

    def stage(way: str, y: mx.array) -> None:
        if way == "message only":
            mx.eval(y)
            mx.eval(send(x))
        elif way == "one graph: send(lin(recv))":
            mx.eval(send(lin(y)))
        elif way == "recv evaluated, then send(lin(y))":
            mx.eval(y)
            mx.eval(send(lin(y)))
        elif way == "lin(recv) evaluated, then send":
            z = lin(y)
            mx.eval(z)
            mx.eval(send(z))
        else:  # each on its own
            mx.eval(y)
            z = lin(y)
            mx.eval(z)
            mx.eval(send(z))

    ways = ["message only", "one graph: send(lin(recv))", "recv evaluated, then send(lin(y))",
            "lin(recv) evaluated, then send", "recv, lin and send each evaluated"]
    for way in ways:
        ts = []
        for _ in range(300):
            t = time.perf_counter()
            if r == 0:
                stage(way, x)  # rank 0 starts the round from its own input
                mx.eval(recv())
            else:
                stage(way, recv())
            ts.append(time.perf_counter() - t)
        if r == 0:
            print(f"{way}: round trip {sorted(ts)[150] * 1e3:.3f} ms (median of 300)", flush=True)
    t = time.perf_counter()
    for _ in range(100):
        mx.eval(lin(x))
    if r == 0:
        print(f"the matmul alone, evaluated: {(time.perf_counter() - t) / 100 * 1e3:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
