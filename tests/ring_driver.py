"""Run under mlx.launch by the tests: greedy-decode several sequences through the real ring with the
real scheduler, sequences arriving and leaving mid-flight.

`--spec` is JSON: a list of `{"prompt": [ids], "max_tokens": n, "at": k}`, where sequence i joins
before scheduler step k (or, with `"after": j` instead of "at", once sequence j has its tokens; with
`"follow": j` too, its prompt is j's prompt, j's tokens, then its own: the next turn of a chat).
`--prompt-cache N` gives rank 0 a prompt cache of N tokens; `--draft K` turns on speculative
decoding (prompt lookup, or `--draft-model DIR`, up to K tokens a step; logits are then recorded
only for steps that verify no drafts). Every rank writes `rank{r}.json` (its layer range, parameter
bytes, resident memory); rank 0 also writes `result.json` (tokens per sequence, the ranks' status
after all sequences left, the rows of each prefill and decode step) and `logits{i}.npy` (one row of
logits per generated token of sequence i). Several `--model`s (with as many `--out` folders) run one
after another in one launch; `--case` gives each its own settings (a JSON object of these flags'
names: spec, groups, chunk, prompt_cache, draft, draft_model, choose_groups, parallel, kv_bits), so
the cases of several tests share one launch's startup.
"""

import argparse
import itertools
import json
from pathlib import Path

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402

import mlx_ring.serving.runner as batching  # noqa: E402
from mlx_ring.cache import kvbits, tiers  # noqa: E402
from mlx_ring.cache.disk import DiskTier  # noqa: E402
from mlx_ring.models.shape import read_shape  # noqa: E402
from mlx_ring.planning.plan import plan_from_sizes, tensor_plan, uniform_plan  # noqa: E402
from mlx_ring.ring.pipeline import Pipeline  # noqa: E402
from mlx_ring.ring.protocol import Kind  # noqa: E402
from mlx_ring.ring.rendezvous import open_control  # noqa: E402
from mlx_ring.ring.transport import Ring  # noqa: E402
from mlx_ring.ring.worker import serve_worker  # noqa: E402
from mlx_ring.ring.world import init_world, ring_description  # noqa: E402
from mlx_ring.serving.params import SamplingParams  # noqa: E402
from mlx_ring.serving.scheduler import Scheduler, Sequence  # noqa: E402
from mlx_ring.serving.warmup import choose_groups  # noqa: E402
from mlx_ring.tensor.lockstep import Lockstep  # noqa: E402
from mlx_ring.tensor.worker import serve_tensor  # noqa: E402
from shard import load_shard, rss_kib  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument(
        "--model",
        required=True,
        nargs="+",
        help="one or more models, run one after another in this launch",
    )
    p.add_argument("--spec", help="the sequences, for every model without its own in --case")
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument(
        "--layers",
        nargs="+",
        default=None,
        help="layers per rank, e.g. 3,2,2 (one for each model; - for even)",
    )
    p.add_argument("--prompt-cache", type=int, default=0)
    p.add_argument("--block", type=int, default=16, help="tokens a prompt-cache block holds")
    p.add_argument(
        "--disk",
        default=None,
        help="each rank keeps prompt-cache blocks on disk under DIR/rank<r> (kept across cases)",
    )
    p.add_argument(
        "--spoil", type=int, nargs="*", default=[], help="these ranks' block files cut short first"
    )
    p.add_argument(
        "--kv-bits", type=int, default=0, help="KV_BITS: blocks kept quantized to 8 or 4 bits"
    )
    p.add_argument(
        "--draft", type=int, default=0, help="speculative decoding: most tokens drafted per step"
    )
    p.add_argument("--draft-model", default=None, help="draft with this model (else prompt lookup)")
    p.add_argument(
        "--choose-groups",
        type=int,
        default=0,
        help="first time ROWS sequences in 1 group and in one per rank "
        "(serving/warmup.py), record it, then go on with --groups",
    )
    p.add_argument(
        "--parallel",
        default="pipeline",
        choices=["pipeline", "tensor"],
        help="tensor: every rank a share of every layer",
    )
    p.add_argument("--out", required=True, nargs="+", help="a folder for each model's results")
    p.add_argument(
        "--case",
        nargs="+",
        default=None,
        help="a JSON object for each model: its own settings over the flags",
    )
    a = p.parse_args()
    world = init_world()
    cases = [case_args(a, json.loads(c)) for c in a.case] if a.case else [a] * len(a.model)
    ring = Ring(world)
    # tensor mode's steps go on the control link, as the server's (opened once for every case)
    tensor = any(c.parallel == "tensor" for c in cases)
    hosts = [f"rank{r}" for r in range(world.size())]
    link = open_control(world, ring_description(), hosts, 60) if tensor else None
    real = batching.sample_rows, batching.sample_lazy
    layers = a.layers or ["-"] * len(a.model)
    # one launch, several models: startup is most of a run
    for model, out, sizes, case in zip(a.model, a.out, layers, cases, strict=True):
        try:
            ring.link = link if case.parallel == "tensor" else None
            run(case, world, ring, Path(model), Path(out), sizes)
        finally:
            batching.sample_rows, batching.sample_lazy = real


def case_args(a: argparse.Namespace, case: dict) -> argparse.Namespace:
    """The flags with one model's own settings over them (its spec as the flag holds it: JSON)."""
    unknown = set(case) - set(vars(a))
    assert not unknown, f"--case names no flag: {sorted(unknown)}"
    return argparse.Namespace(
        **{**vars(a), **case, **({"spec": json.dumps(case["spec"])} if "spec" in case else {})}
    )


def run(a, world, ring: Ring, model: Path, out: Path, sizes: str):
    rank, size = world.rank(), world.size()
    config = model / "config.json"
    n_layers = json.loads(config.read_text())["num_hidden_layers"]
    if a.parallel == "tensor":
        plan = tensor_plan(n_layers, size)
    else:
        plan = (
            uniform_plan(n_layers, size)
            if sizes == "-"
            else plan_from_sizes(n_layers, [int(x) for x in sizes.split(",")])
        )
    shard = load_shard(model, plan, rank, world)
    shard.held.kv = kvbits.for_model(a.kv_bits, read_shape(json.loads(config.read_text())))
    shard.held.salt = tiers.salt(model.name, a.block, shard.held.kv)
    if a.prompt_cache or a.disk:
        shard.block = a.block  # where a prefill notes the states of layers not plain KV caches
    if rank in a.spoil:  # a disk that lost the end of every block
        for f in (Path(a.disk) / f"rank{rank}").rglob("*.kv"):
            f.write_bytes(f.read_bytes()[:-7])
    if a.disk:  # every rank its own folder, as on its own host
        shard.held.disk = DiskTier(
            Path(a.disk) / f"rank{rank}",
            tiers.scope(shard.held.salt, (shard.start, shard.end), (rank, plan.tensor), "f32"),
            1 << 30,
            floor_bytes=0,
        )
    (out / f"rank{rank}.json").write_text(
        json.dumps(shard.info() | {"rss_kib": rss_kib(), "size": size})
    )
    if rank != 0:
        # until rank 0's shutdown step for this model
        (serve_tensor if shard.tensor else serve_worker)(shard, ring)
        return shard.held.disk and shard.held.disk.close()

    # Record the logits each sequence's token was sampled from, on both of the scheduler's paths.
    owner, rows = {}, {}

    def record(samplers, logits):
        for s, row in zip(samplers, np.array(logits.astype(mx.float32))):
            if id(s) in owner:  # not a --choose-groups sequence
                rows.setdefault(owner[id(s)], []).append(row)

    def recording(real, only_if_sampled=False):
        def wrapped(samplers, logits):
            out = real(samplers, logits)
            if out is not None or not only_if_sampled:
                record(samplers, logits)
            return out

        return wrapped

    batching.sample_rows = recording(batching.sample_rows)
    batching.sample_lazy = recording(batching.sample_lazy, only_if_sampled=True)

    spec = json.loads(a.spec)
    pipe = Lockstep(shard, ring, shard.world) if plan.tensor > 1 else Pipeline(shard, ring)
    # rows of each prefill and decode step: which sequences went together
    prefill_rows, decode_rows = [], []
    submit = pipe.submit

    steps = []  # the kind of every step, in order ("DECODE+drop": rejected drafts dropped first)

    def recording_submit(header, payload, tag=None, chained=False):
        steps.append(
            Kind(header.kind).name
            + ("+drop" if header.kind == Kind.DECODE and header.offset else "")
        )
        if header.kind in (Kind.PREFILL, Kind.DECODE):
            (prefill_rows if header.kind == Kind.PREFILL else decode_rows).append(header.shape[0])
        submit(header, payload, tag, chained)

    pipe.submit = recording_submit
    disk = shard.held.disk
    prefix = (
        tiers.block_index(a.prompt_cache, shard.held.salt, a.block, disk, not shard.plain_kv)
        if a.prompt_cache or disk
        else None
    )
    sched = Scheduler(
        pipe,
        shard,
        groups=a.groups,
        chunk=a.chunk,
        prefix=prefix,
        draft_tokens=a.draft,
        draft_model=load_model(Path(a.draft_model))[0] if a.draft_model else None,
    )
    chosen = None
    if a.choose_groups:
        rate = choose_groups(
            sched, itertools.count(10_000), [5, 17, 42, 99], a.choose_groups, tokens=4
        )
        chosen = {"rate": rate, "groups": len(sched.groups), "idle": sched.idle()}
        sched.set_groups(a.groups)
    waiting = list(range(len(spec)))
    tokens = {i: [] for i in range(len(spec))}

    def due(i):
        s = spec[i]
        return (
            len(tokens[s["after"]]) >= spec[s["after"]]["max_tokens"]
            if "after" in s
            else s["at"] <= step
        )

    step = 0
    while waiting or not sched.idle():
        for i in [i for i in waiting if due(i)]:
            waiting.remove(i)
            if "follow" in spec[i]:
                j = spec[i]["follow"]
                spec[i]["prompt"] = spec[j]["prompt"] + tokens[j] + spec[i]["prompt"]
            seq = Sequence(i, spec[i]["prompt"], SamplingParams(temperature=0.0))
            owner[id(seq.sampler)] = i
            sched.add(seq)
        for seq, token in sched.step():
            # a verify step may give more than asked
            if len(tokens[seq.id]) < spec[seq.id]["max_tokens"]:
                tokens[seq.id].append(token.id)
            if len(tokens[seq.id]) >= spec[seq.id]["max_tokens"]:
                sched.remove(seq)
        step += 1
    status = []
    sched.status(status.extend)
    while not status:
        sched.step()
    for i, r in rows.items():  # a sequence's last step may have computed one token more, dropped
        np.save(out / f"logits{i}.npy", np.stack(r[: spec[i]["max_tokens"]]))
    cache = (
        {
            "hits": prefix.hits,
            "hit_tokens": prefix.hit_tokens,
            "disk_tokens": prefix.disk_tokens,
            "entries": len(prefix.entries),
        }
        if prefix is not None
        else None
    )
    (out / "result.json").write_text(
        json.dumps(
            {
                "tokens": [tokens[i] for i in range(len(spec))],
                "status": status,
                "prompts": [s["prompt"] for s in spec],
                "prefill_rows": prefill_rows,
                "decode_rows": decode_rows,
                "prompt_cache": cache,
                "drafted": sched.drafted,
                "accepted": sched.accepted,
                "steps": steps,
                "chosen": chosen,
            }
        )
    )
    pipe.shutdown()
    if disk is not None:
        disk.close()  # the next case (a restart) reads what this one wrote


if __name__ == "__main__":
    main()
