"""Where a decode step's time goes on each rank: rank 0 times collect/settle/submit around the real
scheduler; workers time header wait, payload wait, stage, send per DECODE step and print at each PING.
Env: SPLIT=1 evaluates the stage before the send (extra sync); WAITPAY=1 waits for the payload first."""
import os, sys, time
sys.path.insert(0, os.path.join(os.getcwd(), "tools"))
from mlx_ring.gpu import one_gpu_per_rank
one_gpu_per_rank()
import mlx.core as mx
from pathlib import Path
import bench_steps as bs
from mlx_ring.planning.plan import uniform_plan
from mlx_ring.planning.sizes import spec_from_folder
from mlx_ring.ring.pipeline import Pipeline
from mlx_ring.ring.protocol import Header, Kind
from mlx_ring.ring.transport import Ring, init_world
from mlx_ring.serving.scheduler import Scheduler
from shard import load_shard

SPLIT, WAITPAY = os.environ.get("SPLIT") == "1", os.environ.get("WAITPAY") == "1"


def worker(shard, ring):
    st = {"n": 0, "hdr": 0.0, "pay": 0.0, "build": 0.0, "stage": 0.0, "send": 0.0, "other": 0.0}
    if WAITPAY:
        ring.wait_in_kernel = True
    t_prev = time.perf_counter()
    while True:
        header, payload = ring.recv(lazy=True)
        t0 = time.perf_counter()
        if header.kind == Kind.PING:
            n = max(st["n"], 1)
            print(f"rank {ring.rank} DECODE x{st['n']}: " + " ".join(f"{k} {st[k] / n * 1e3:.2f}ms" for k in ("hdr", "pay", "build", "stage", "send")) + f" other-steps {st['other']:.2f}s", flush=True)
            st = dict.fromkeys(st, 0.0); st["n"] = 0
        dec = header.kind == Kind.DECODE
        if dec and WAITPAY:
            ring.wait_payload(); mx.eval(payload)
        t1 = time.perf_counter()
        out = shard.apply(header, payload)
        tb = time.perf_counter()
        if dec and SPLIT and out is not None:
            mx.eval(out)
        t2 = time.perf_counter()
        ring.send(header, out)
        t3 = time.perf_counter()
        if dec:
            st["n"] += 1; st["hdr"] += t0 - t_prev; st["pay"] += t1 - t0; st["build"] += tb - t1; st["stage"] += t2 - tb; st["send"] += t3 - t2
        else:
            st["other"] += t3 - t_prev
        t_prev = t3
        if header.kind == Kind.SHUTDOWN:
            return


def main():
    model = Path(sys.argv[1]); streams = [int(x) for x in sys.argv[2].split(",")]
    world = init_world()
    shard = load_shard(model, uniform_plan(spec_from_folder(model).n_layers, world.size()), world.rank())
    ring = Ring(world)
    if world.rank():
        return worker(shard, ring)
    pipe = Pipeline(shard, ring)
    sched = Scheduler(pipe, shard, chunk=512)
    prompt = lambda i: [(7 * i + j) % 30000 + 100 for j in range(25)]
    tm = {}
    for name in ("collect", "settle", "submit"):
        f = getattr(pipe, name)
        def wrapped(*a, _f=f, _n=name, **k):
            t = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                tm[_n] = tm.get(_n, 0.0) + time.perf_counter() - t
        setattr(pipe, name, wrapped)
    for n in streams:
        bs.run(sched, n, 4, prompt)
    pipe.round_trip(Header(Kind.PING))
    for n in streams:
        tm.clear()
        dt, line = bs.run(sched, n, 64, prompt)
        print(f"{ring.size} ranks SPLIT={SPLIT} WAITPAY={WAITPAY}: {line}; rank0 " + " ".join(f"{k} {v:.3f}s" for k, v in tm.items()) + f" python {dt - sum(tm.values()):.3f}s", flush=True)
        pipe.round_trip(Header(Kind.PING))
    time.sleep(0.5)
    pipe.shutdown()


main()
