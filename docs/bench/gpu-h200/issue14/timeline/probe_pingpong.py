"""Two processes on one GPU taking turns, as a 2-rank ring's stages do, but handing the step over a
multiprocessing pipe instead of MLX's ring backend: does sharing the GPU alone slow each half?
PAYLOAD=1 passes the real activations as host bytes (as the ring does); else a 1-byte token."""
import multiprocessing as mp, os, sys, time


def role(rank, conn, rows_list, payload, q):
    from pathlib import Path
    import numpy as np
    import mlx.core as mx
    from mlx_ring.planning.plan import uniform_plan
    from mlx_ring.planning.sizes import spec_from_folder
    from mlx_ring.ring.protocol import Header, Kind
    from shard import load_shard
    M = Path(os.environ.get("MODEL", "/tmp/llama8b"))
    import json; H = json.loads((M / "config.json").read_text())["hidden_size"]
    sh = load_shard(M, uniform_plan(spec_from_folder(M).n_layers, 2), rank)
    for B in rows_list:
        h = mx.random.normal((B, 25, H)).astype(mx.bfloat16)
        mx.eval(sh.apply(Header.for_payload(Kind.PREFILL, h, batch=B), h))
        pad = mx.zeros((B,), dtype=mx.int32)
        sh.apply(Header.for_payload(Kind.JOIN, pad, batch=B, group=B), pad)
        x = mx.random.normal((B, 1, H)).astype(mx.bfloat16); mx.eval(x)
        conn.send_bytes(b"r"); conn.recv_bytes()  # both ready
        ts, t_start = [], None
        for i in range(45):
            if rank == 1 or i > 0:
                got = conn.recv_bytes()
                if payload:
                    x = mx.array(np.frombuffer(got, dtype=np.uint16).reshape(B, 1, H)).view(mx.bfloat16)
            if i == 5:
                t_start = time.perf_counter()
            t0 = time.perf_counter()
            out = sh.apply(Header.for_payload(Kind.DECODE, x, group=B), x)
            mx.eval(out)
            ts.append(time.perf_counter() - t0)
            conn.send_bytes(np.array(out.astype(mx.bfloat16).view(mx.uint16)).tobytes() if payload else b"x")
            for c in sh.groups[B]:
                c.trim(1)
        if rank == 0:
            conn.recv_bytes()
        period = (time.perf_counter() - t_start) / 40
        ts = sorted(ts[5:])
        q.put((rank, B, ts[len(ts) // 2] * 1e3, period * 1e3))


if __name__ == "__main__":
    rows = [int(r) for r in sys.argv[1].split(",")]
    payload = os.environ.get("PAYLOAD") == "1"
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    q = ctx.Queue()
    ps = [ctx.Process(target=role, args=(0, a, rows, payload, q)), ctx.Process(target=role, args=(1, b, rows, payload, q))]
    for p in ps: p.start()
    for p in ps: p.join()
    res = sorted(q.get() for _ in range(2 * len(rows)))
    for B in rows:
        r0 = next(r for r in res if r[0] == 0 and r[1] == B); r1 = next(r for r in res if r[0] == 1 and r[1] == B)
        print(f"pingpong PAYLOAD={int(payload)} rows {B}: half 0 {r0[2]:.2f} ms, half 1 {r1[2]:.2f} ms (build+eval, median); period {r0[3]:.2f} ms", flush=True)
