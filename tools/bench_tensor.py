"""Tensor mode's step on the real scheduler without HTTP, in turn with mlx-lm's own loop on the same
model cut by its own `shard()` (every rank runs `generate_step`, or `BatchGenerator` for several
streams, joined by the same all_sums), in the same processes, --rounds times. Run it under
mlx.launch, a GPU per rank (tensor mode's all_sums then go over NCCL, as in the server):

    CUDA_PER_RANK=1 python tools/fed.py mlx.launch --backend ring --hostfile h2.json -- \\
        python tools/bench_tensor.py --model DIR --streams 1,16 --peers

--trace FILE then runs one stream once more and prints, per rank, where a decode step's time goes:
rank 0's header leaving, each worker's header arriving, its graph built, its wait in the step (the
device and the all_sums), and its wait for the next header (ranks on one host: one clock).
"""

import argparse
import json
import statistics
import time
from pathlib import Path

from mlx_ring.gpu import one_gpu_per_rank  # noqa: E402

one_gpu_per_rank()  # before MLX starts

import mlx.core as mx  # noqa: E402
import mlx_lm_loop  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402
from ring_join import trace_file  # noqa: E402
from scheduler_run import prompts, run  # noqa: E402
from step_split import split_generate_step, split_ring  # noqa: E402

from mlx_ring.planning.plan import tensor_plan  # noqa: E402
from mlx_ring.planning.sizes import spec_from_folder  # noqa: E402
from mlx_ring.ring.protocol import Header, Kind  # noqa: E402
from mlx_ring.ring.rendezvous import open_control  # noqa: E402
from mlx_ring.ring.timeline import between_each_ping, tensor_steps  # noqa: E402
from mlx_ring.ring.transport import Ring  # noqa: E402
from mlx_ring.ring.worker import serve_worker  # noqa: E402
from mlx_ring.ring.world import init_world, ring_description  # noqa: E402
from mlx_ring.serving.scheduler import Scheduler  # noqa: E402
from mlx_ring.tensor.lockstep import Lockstep  # noqa: E402
from mlx_ring.tensor.sums import sum_group  # noqa: E402
from mlx_ring.tensor.worker import serve_tensor  # noqa: E402
from shard import load_shard  # noqa: E402


def phases(
    streams: list[int], rounds: int, max_tokens: int, peers: bool
) -> list[tuple[str, int, int]]:
    """What every rank runs, in order: ("ring" or "peer", streams, tokens); a short warm-up of each
    shape first (kernels compile for each new shape on CUDA)."""
    out = [(who, n, 4) for n in streams for who in ("ring", "peer")[: 1 + peers]]
    for n in streams:
        out += [
            (who, n, max_tokens) for _ in range(rounds) for who in ("ring", "peer")[: 1 + peers]
        ]
    return out


def peer_loop(model, n: int, tokens: int, prompt) -> tuple[float, str]:
    return (
        mlx_lm_loop.one_stream(model, prompt(0), tokens)
        if n == 1
        else mlx_lm_loop.many_streams(model, n, tokens, prompt)
    )


def release(pipe: Lockstep) -> None:
    """Let the workers out of their step loop (they then run mlx-lm's loop, or leave)."""
    pipe.shutdown()


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", type=Path, required=True, help="MLX model folder")
    p.add_argument("--streams", default="1,16")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=25)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--peers",
        action="store_true",
        help="mlx-lm's loop on its own shard() of a second copy, in turn",
    )
    p.add_argument(
        "--split",
        action="store_true",
        help="rank 0's one-stream decode step split into Python, MLX encoding and "
        "the wait for the token (step_split.split_ring); with --peers, mlx-lm's too",
    )
    p.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="every rank's step events of a last one-stream run, to this JSON file",
    )
    a = p.parse_args()
    a.prompt = None  # token ids that mean nothing (bench_steps' default)
    a.prompt_of = prompts(a)
    world = init_world()
    description = ring_description()
    sums = sum_group(world, description)
    plan = tensor_plan(spec_from_folder(a.model).n_layers, world.size())
    shard = load_shard(a.model, plan, world.rank(), sums)
    hosts = [f"rank{r}" for r in range(world.size())]
    # as the server's tensor mode
    ring = Ring(world, link=open_control(world, description, hosts, 60))
    ring.trace = [] if a.trace else None
    peer = None
    if a.peers:
        peer = load_model(a.model, lazy=True)[0]
        peer.shard(sums)
        mx.eval(peer.parameters())
    todo = phases([int(x) for x in a.streams.split(",")], a.rounds, a.max_tokens, a.peers)
    pipe = Lockstep(shard, ring, sums) if world.rank() == 0 else None
    # one decode group, as the server runs tensor mode
    sched = Scheduler(pipe, shard, groups=1) if pipe else None
    times: dict[tuple[str, int], list[float]] = {}
    for i, (who, n, tokens) in enumerate(todo):
        if who == "peer":
            seconds, line = peer_loop(peer, n, tokens, a.prompt_of)
        elif pipe is None:  # a worker: serve steps until rank 0 lets it out
            if i == 0 or todo[i - 1][0] != "ring":
                (serve_tensor if shard.tensor else serve_worker)(shard, ring)
            continue
        else:
            seconds, line = run(sched, n, tokens, a.prompt_of)
            if i + 1 < len(todo) and todo[i + 1][0] == "peer":
                release(pipe)
        if pipe is not None and tokens > 4:
            times.setdefault((who, n), []).append(seconds)
            print(f"tensor-{world.size()} {who}: {line}", flush=True)
    if pipe is not None:
        for n in sorted({n for _, n in times}):
            ring_s = times[("ring", n)]
            ratio = (
                (
                    ", ring/mlx-lm speed median "
                    f"{statistics.median(q / p for p, q in zip(ring_s, times[('peer', n)])):.3f}"
                )
                if ("peer", n) in times
                else ""
            )
            print(
                (
                    f"tensor-{world.size()}, {n} streams: ring "
                    f"{n * a.max_tokens / statistics.median(ring_s):.1f} tok/s{ratio}"
                ),
                flush=True,
            )
    # a worker: through rank 0's split and traced runs (if any), then its events for rank 0
    if pipe is None:
        if (a.trace or a.split) and todo[-1][0] == "peer":
            (serve_tensor if shard.tensor else serve_worker)(shard, ring)
        if a.trace:
            path = trace_file(a.trace, ring.rank)
            part = path.with_name(path.name + ".part")
            part.write_text(json.dumps(ring.trace))
            part.replace(path)
        return split_peer(a, peer, show=False)
    for _ in range(a.rounds if a.split else 0):
        print(split_ring(sched, a.max_tokens, a.prompt_of), flush=True)
    if not a.trace:
        if todo[-1][0] == "ring" or a.split:
            release(pipe)
        return split_peer(a, peer, show=True)
    pipe.round_trip(Header(Kind.PING))
    run(sched, 1, a.max_tokens, a.prompt_of)
    pipe.round_trip(Header(Kind.PING))
    release(pipe)
    ranks = [ring.trace]
    for r in range(1, ring.size):
        path, deadline = trace_file(a.trace, r), time.monotonic() + 60
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        ranks.append(json.loads(path.read_text()))
        path.unlink()
    a.trace.write_text(json.dumps(ranks))
    print(f"tensor-{ring.size}, 1 stream, where a decode step's time goes (median ms):", flush=True)
    for line in step_times(ranks):
        print(line, flush=True)
    split_peer(a, peer, show=True)


def split_peer(a, peer, show: bool) -> None:
    """With --split and --peers, mlx-lm's own loop split as the server's step is, --rounds times:
    every rank runs it (its all_sums need them all); rank 0 (`show`) prints it."""
    for _ in range(a.rounds if a.split and a.peers else 0):
        line = split_generate_step(peer, a.prompt_of(0), a.max_tokens)
        if show:
            print("mlx-lm's loop, rank 0: " + line, flush=True)


def step_times(ranks: list[list]) -> list[str]:
    """Per rank, the median parts of a DECODE step between the two PINGs: rank 0's period (header to
    header) and its header-to-built and header-to-done; a worker's hop (rank 0's header leaving to
    it arriving), header to built (below zero for a step built before its header came), wait in the
    step, and wait for the next header."""
    steps = [tensor_steps(between_each_ping(events)[0], r) for r, events in enumerate(ranks)]
    n = min(len(s) for s in steps)
    decode = [i for i in range(n) if steps[0][i]["kind"] == Kind.DECODE]
    med = lambda xs: statistics.median(xs) * 1e3 if xs else float("nan")  # noqa: E731
    s0 = steps[0]
    lines = [
        f"rank 0: {len(decode)} DECODE steps of {n}; period "
        f"{med([s0[i + 1]['out'] - s0[i]['out'] for i in decode if i + 1 < n]):.2f}, header to "
        f"built {med([s0[i]['built'] - s0[i]['out'] for i in decode]):.2f}, header to done "
        f"{med([s0[i]['done'] - s0[i]['out'] for i in decode if 'done' in s0[i]]):.2f}"
    ]
    for r, s in enumerate(steps[1:], 1):
        lines.append(
            f"rank {r}: hop {med([s[i]['in'] - s0[i]['out'] for i in decode]):.2f}, header to "
            f"built {med([s[i]['built'] - s[i]['in'] for i in decode]):.2f} (built before its "
            f"header: {sum(s[i]['built'] < s[i]['in'] for i in decode)}), in the step "
            f"{med([s[i]['done'] - s[i]['built'] for i in decode]):.2f}, waiting for the next "
            f"header {med([s[i + 1]['in'] - s[i]['done'] for i in decode if i + 1 < n]):.2f}"
        )
    return lines


if __name__ == "__main__":
    main()
