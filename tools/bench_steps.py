"""Drive the real scheduler on the ring without HTTP: how many steps of each kind, and how
long, it takes N concurrent sequences (greedy, unless --feature) to produce their tokens. Run it
under mlx.launch like the server:

    python tools/fed.py mlx.launch --backend ring --hostfile hosts.json -- \\
        python tools/bench_steps.py --model DIR --streams 1,16,64
    (tools/fed.py feeds mlx.launch's stdin, on which it would otherwise spin cores the ranks need)
    (add CUDA_PER_RANK=1 to the environment on a multi-GPU host; --profile prints rank 0's cProfile;
    --trace FILE prints where a decode step's time goes on each rank, ranks on one host only)

With --draft-tokens K (and --draft-model DIR, else prompt lookup), each line is timed in --rounds
alternating pairs, plain then drafting, in the same processes: the cost or gain of drafting without
the run-to-run drift of separate servers. With --peers (one rank), each line alternates the ring's
scheduler with mlx-lm's own loop (tools/mlx_lm_loop.py) on a second copy of the model, likewise;
--split then times one stream's step by its parts (Python, MLX encoding, the wait for the token), as
`split_ring` and `split_generate_step` in step_split.py do (bench_tensor.py's --split too).
--feature samples every stream as one of bench_features.py's requests asks (greedy by default):
with --peers, one stream against mlx-lm's loop with its own sampler and processors for it.
"""

import argparse
import cProfile
import json
import pstats
import statistics
import sys
from pathlib import Path

from mlx_ring.gpu import one_gpu_per_rank  # noqa: E402

one_gpu_per_rank()  # before MLX starts

import mlx_lm_loop  # noqa: E402
from bench_features import FEATURES, PEERS  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402
from ring_join import join_ring, traced  # noqa: E402
from scheduler_run import prompts, run  # noqa: E402
from step_split import split_generate_step, split_ring  # noqa: E402

from mlx_ring.api.openai_request import ChatCompletionRequest  # noqa: E402
from mlx_ring.cache.blocks import BlockIndex  # noqa: E402
from mlx_ring.ring.timeline import decode_times, summary  # noqa: E402
from mlx_ring.serving.scheduler import Scheduler  # noqa: E402


def draft_ab(sched: Scheduler, n: int, a) -> None:
    """Plain and drafting runs in turn; each line's tokens/s, then the drafting/plain
    ratio of the sums."""
    k, totals = sched.draft_tokens, {0: 0.0, 1: 0.0}
    for r in range(a.rounds):
        for drafting in (0, 1):
            sched.draft_tokens = k if drafting else 0
            before = (sched.drafted, sched.accepted)
            seconds, line = run(sched, n, a.max_tokens, a.prompt_of)
            totals[drafting] += seconds
            kept = (
                f", drafts kept {sched.accepted - before[1]}/{sched.drafted - before[0]}"
                if drafting
                else ""
            )
            print(f"round {r} {'drafting' if drafting else 'plain'}: {line}{kept}", flush=True)
    sched.draft_tokens = k
    print(
        (
            f"{n} streams, {a.rounds} rounds: drafting took {totals[1] / totals[0]:.3f}x the "
            "time of plain decoding"
        ),
        flush=True,
    )


def peer_ab(sched: Scheduler, model, n: int, a) -> None:
    """The ring's scheduler and mlx-lm's own loop (`generate_step` for one stream,
    `BatchGenerator` for several) in turn, --rounds times, in this process; then the min and
    median of ring/mlx-lm."""
    times: dict[str, list[float]] = {"ring": [], "mlx_lm": []}
    for r in range(a.rounds):
        seconds, line = run(sched, n, a.max_tokens, a.prompt_of, a.params)
        times["ring"].append(seconds)
        print(f"round {r} ring-{sched.pipe.ring.size}: {line}", flush=True)
        seconds, line = (
            mlx_lm_loop.one_stream(model, a.prompt_of(0), a.max_tokens, *a.peer)
            if n == 1
            else mlx_lm_loop.many_streams(model, n, a.max_tokens, a.prompt_of)
        )
        times["mlx_lm"].append(seconds)
        print(f"round {r} {line}", flush=True)
    # speed: ring over mlx-lm
    ratios = sorted(p / q for p, q in zip(times["mlx_lm"], times["ring"]))
    print(
        f"{n} streams, {a.rounds} rounds: ring/mlx-lm speed min {ratios[0]:.3f}, median "
        f"{statistics.median(ratios):.3f}, max {ratios[-1]:.3f}",
        flush=True,
    )


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", type=Path, required=True, help="MLX model folder")
    p.add_argument("--streams", default="1,16,64")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=25)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument(
        "--groups", type=int, default=0, help="decode groups (micro-batches; 0: one per rank)"
    )
    p.add_argument(
        "--layers", default=None, help="layers per rank, e.g. 11,19 (default: an even split)"
    )
    p.add_argument("--profile", action="store_true")
    p.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="time each rank's part of the decode steps of the last "
        "stream count (2 or more ranks on one host); the events go to this JSON file",
    )
    p.add_argument(
        "--draft-tokens",
        type=int,
        default=0,
        help="A/B drafting (up to K tokens) against plain decoding",
    )
    p.add_argument(
        "--draft-model", type=Path, default=None, help="draft with this model (else prompt lookup)"
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--prompt",
        default=None,
        help="a user message for every stream (else token ids that mean nothing); "
        "{n} in it becomes a number new to each request",
    )
    p.add_argument(
        "--peers",
        action="store_true",
        help="one rank: mlx-lm's own loop in turn with the ring's, --rounds "
        "times (generate_step for one stream, BatchGenerator for several; a "
        "second copy of the model)",
    )
    p.add_argument(
        "--split",
        action="store_true",
        help="one stream's decode step split into Python, MLX encoding and "
        "the wait for the token, for the ring and, with --peers, generate_step",
    )
    p.add_argument(
        "--prompt-cache",
        type=int,
        default=0,
        help="prompt cache of this many tokens, as the server keeps (0: off)",
    )
    p.add_argument(
        "--prefill-budget",
        type=int,
        default=0,
        help="prompt tokens on the ring at once, as the server's plan grants (0: no bound)",
    )
    p.add_argument(
        "--prefill-step",
        type=int,
        default=0,
        help="prompt tokens of one prefill step (rows x chunk; 0: one "
        "chunk), as the server's plan grants a CUDA device",
    )
    p.add_argument(
        "--feature",
        choices=list(PEERS),
        default="greedy",
        help="how every stream samples, as bench_features.py asks it through HTTP (and, with "
        "--peers, mlx-lm's own sampler and processors for one stream)",
    )
    a = p.parse_args()
    a.prompt_of = prompts(a)
    # the request's settings as the server's own adapter turns them into the engine's
    a.params = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "."}], **FEATURES[a.feature]
    ).sampling(0)
    a.peer = PEERS[a.feature]
    pipe = join_ring(a.model, a.trace, a.layers)
    if pipe is None:
        return
    shard = pipe.stage
    drafter = load_model(a.draft_model)[0] if a.draft_model else None
    prefix = BlockIndex(a.prompt_cache) if a.prompt_cache else None
    sched = Scheduler(
        pipe,
        shard,
        groups=a.groups,
        chunk=a.chunk,
        prefix=prefix,
        draft_tokens=a.draft_tokens,
        draft_model=drafter,
        prefill_budget=a.prefill_budget,
        prefill_step=a.prefill_step,
    )
    streams = [int(x) for x in a.streams.split(",")]
    if a.peers and pipe.ring.size > 1:
        raise SystemExit("--peers runs mlx-lm's loop beside a ring of one rank")
    if a.peers and a.feature != "greedy" and streams != [1]:
        raise SystemExit("--peers with --feature: one stream (mlx-lm's batch loop is greedy here)")
    peer = load_model(a.model)[0] if a.peers else None
    for n in streams:  # warm-up: kernels compile for each new shape on CUDA
        run(sched, n, 4, a.prompt_of, a.params)
        if peer is not None and n == 1:
            mlx_lm_loop.one_stream(peer, a.prompt_of(0), 4, *a.peer)
        elif peer is not None:
            mlx_lm_loop.many_streams(peer, n, 4, a.prompt_of)
    for n in streams:
        if peer is not None:
            peer_ab(sched, peer, n, a)
        elif a.draft_tokens:
            draft_ab(sched, n, a)
        else:
            print(
                f"{pipe.ring.size} rank(s):",
                run(sched, n, a.max_tokens, a.prompt_of, a.params)[1],
                flush=True,
            )
    for _ in range(a.rounds if a.split else 0):
        print(split_ring(sched, a.max_tokens, a.prompt_of, a.params), flush=True)
        if peer is not None:
            print(split_generate_step(peer, a.prompt_of(0), a.max_tokens, *a.peer), flush=True)
    if a.profile:
        prof = cProfile.Profile()
        prof.runcall(run, sched, max(streams), a.max_tokens, a.prompt_of, a.params)
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(20)
    if a.trace and pipe.ring.size > 1:
        ranks = traced(sched, streams[-1], a)
        a.trace.write_text(json.dumps(ranks))
        print(
            f"{pipe.ring.size} rank(s), {streams[-1]} streams:",
            summary(decode_times(ranks)),
            flush=True,
        )
    else:
        pipe.shutdown()


if __name__ == "__main__":
    main()
