"""Rank 0's warm-up before it serves: the steps first requests would run (a prefill, decode at the
batch sizes a GPU builds kernels for with every way a row samples, on CUDA a prompt of every length
up to a chunk), so no client waits for MLX to build them; and, on a ring on a GPU, the number of
decode groups that decodes a full batch fastest there."""

import itertools
import logging
import time
from dataclasses import replace

import mlx.core as mx

from mlx_ring.planning.capabilities import Capabilities, compute_units
from mlx_ring.planning.cluster import RankFacts
from mlx_ring.planning.cost import room_after
from mlx_ring.planning.plan import ModelSpec
from mlx_ring.planning.report import kv_room_gb, most_gb
from mlx_ring.serving.grammar_text import json_grammar
from mlx_ring.serving.params import SamplingParams
from mlx_ring.serving.rows import Sequence
from mlx_ring.serving.scheduler import Scheduler


def decode_groups(setting: int, caps: list[Capabilities], batches: bool) -> tuple[int, str]:
    """The number of decode groups to start with, and why: GROUPS where set; else one per device
    the ranks compute on (`compute_units`). Ranks that take turns on one machine's cores gain
    nothing from keeping each at work on a group of its own, while each then runs a step per
    group, and a decode step costs about as much for a few rows as for a handful (2 ranks on 2
    shared cores: 4 streams 2.0-2.2x one stream in 2 groups, 3.0x in one). A model that decodes
    one request per group keeps one per rank: its groups are the requests it serves at once."""
    if setting:
        return setting, "GROUPS"
    if not batches:
        return len(caps), "one per rank: each decodes one request at a time"
    units = compute_units(caps)
    if units == len(caps):
        return units, "one per rank: each computes on a device of its own"
    return units, (
        f"one per device the {len(caps)} ranks compute on: ranks on one machine without cores or a "
        "GPU of their own take turns on it"
    )


def warm_rows(max_active: int) -> list[int]:
    """How many sequences each warm-up round runs at once: 1, 2, 4, ... up to `max_active` on a
    GPU, whose kernels are built on first use; 1 on a CPU, where only the first request's own
    work is new."""
    if mx.default_device() == mx.cpu:
        return [1]
    return [n for n in (2**k for k in range(12)) if n < max_active] + [max_active]


log = logging.getLogger(__name__)

GREEDY = SamplingParams(temperature=0.0)
# Every way rows of one plain setting sample together (sampling.sample_lazy): greedy and a draw,
# with and without log-probabilities (a client that asks for none gets unnormalised logits), and
# each filter. Their values are arrays to MLX (draws.py): one value builds the kernels of all.
BATCHED = [
    *(SamplingParams(temperature=t, logprobs=lp) for t in (0.0, 1.0) for lp in (False, True)),
    SamplingParams(top_p=0.9),
    SamplingParams(min_p=0.05),
    SamplingParams(top_k=40),
]


def warm(
    sched: Scheduler,
    ids: itertools.count,
    prompt: list[int],
    max_active: int,
    chunk: int,
    may_regroup: bool,
    nccl: bool,
    constrain=None,
) -> list[dict]:
    """All of rank 0's warm-up, in order, each part logged: decode at the batch sizes and with
    every way first requests sample (`constrain`: a grammar -> its logits processor, as the
    engine's), prompts of every length on CUDA (`warm_lengths`: a whole chunk only where tensor
    mode sums over NCCL, `nccl`), the prompt cache seeded with `prompt` (a short chat) and, where
    `may_regroup` (GROUPS auto, a batching model) on a GPU, the faster of the groups it starts
    with and one. Returns every rank's `StatusRow` (as a dict) after it: the warm-up runs the
    largest batch and the longest chunk, so their peaks are the working peaks."""
    rows, params = warm_rows(max_active), warm_params()
    # on a CPU none: what it builds, it keeps on disk for the next start (MLX's cache)
    alone = alone_params(constrain is not None) if mx.default_device() != mx.cpu else []
    took = warm_up(sched, ids, prompt, rows, params=params)
    took += warm_mixed(sched, ids, prompt, rows, alone, constrain)
    log.info(
        "warmed up in %.2f s (%s sequences at once; %d sampling settings batched, %d sampled "
        "row by row, alone and mixed in one group; MLX peak memory %.2f GiB)",
        took,
        ", ".join(map(str, rows)),
        len(params),
        len(alone),
        peak_gib(),
    )
    if lengths := warm_lengths(chunk, nccl):
        which = (
            f"a prompt of {chunk} tokens"
            if len(lengths) == 1
            else f"prompts of every length up to {chunk}"
        )
        log.info(
            (
                "%s warmed in %.1f s (CUDA plans each new matmul shape on first use; MLX "
                "peak memory %.2f GiB)"
            ),
            which,
            warm_prompts(sched, ids, prompt, lengths),
            peak_gib(),
        )
    seed_prompt_cache(sched, ids, prompt)
    if may_regroup and len(sched.groups) > 1 and mx.default_device() != mx.cpu:
        rate = choose_groups(sched, ids, prompt, max_active)
        log.info(
            "decode groups: %d (%d sequences decoded %s; GROUPS sets the number)",
            len(sched.groups),
            max_active,
            ", ".join(f"{v:.0f} tokens/s in {g} group{'s' * (g > 1)}" for g, v in rate.items()),
        )
    status = rank_memory(sched)
    log.info(
        "MLX peak memory after the warm-up: %s",
        ", ".join(f"rank {r['rank']} {r['mlx_peak_memory_kib'] / 2**20:.2f} GiB" for r in status),
    )
    return status


def rank_memory(sched: Scheduler) -> list[dict]:
    """Every rank's `StatusRow` as a dict, from one STATUS step round the ring."""
    rows: list[dict] = []
    sched.status(rows.extend)
    while not rows:
        sched.step()
    return rows


def activations_gib(status: list[dict], weights: list[int]) -> list[float]:
    """GiB of each rank's MLX peak beyond its `weights` (KiB), the most its KV caches held and its
    prompt cache: what its activations and buffers took."""
    return [
        max(
            0.0,
            (row["mlx_peak_memory_kib"] - kib - row["kv_cache_peak_kib"] - row["prompt_cache_kib"])
            / 2**20,
        )
        for row, kib in zip(status, weights)
    ]


def weights_kib(ranks: tuple[RankFacts, ...]) -> list[int]:
    return [r.parameter_bytes_kib for r in ranks]


def planned_runtime(ranks: tuple[RankFacts, ...]) -> list[float]:
    """Each rank's runtime in the plan (GiB): its activations as estimated."""
    return [r.planned.runtime_gb if r.planned else 0.0 for r in ranks]


def fit_room(
    spec: ModelSpec, ranks: tuple[RankFacts, ...], status: list[dict], kv_room: int, kv_tokens: int
) -> int:
    """The KV room (tokens every rank holds at once) less what each rank's activations took beyond
    its runtime in the plan during the warm-up; logged, with a warning below `kv_tokens`."""
    # On CUDA, MLX keeps a graph's intermediate arrays until the graph has run: a prefill chunk's
    # activations for many layers at once (docs/benchmarks.md, memory against the plan).
    planned = planned_runtime(ranks)
    excess = [
        max(0.0, m - p) * 2**30
        for m, p in zip(activations_gib(status, weights_kib(ranks)), planned)
    ]
    fitted = room_after(spec, kv_room, [r.layers[1] - r.layers[0] for r in ranks], excess)
    if fitted < kv_room:
        worst = max(range(len(excess)), key=excess.__getitem__)
        log.info(
            "KV cache: room for %d tokens at once, not %d: rank %d's activations took %.2f GiB "
            "more than the plan's %.2f GiB runtime during the warm-up",
            fitted,
            kv_room,
            worst,
            excess[worst] / 2**30,
            planned[worst],
        )
    if fitted < kv_tokens:
        log.warning(
            "the ring has room for %d tokens of KV cache, fewer than KV_TOKENS=%d: lower "
            "PREFILL_CHUNK or MAX_ACTIVE, or give the ranks more memory",
            fitted,
            kv_tokens,
        )
    return fitted


def count_measured(
    spec: ModelSpec | None, ranks: tuple[RankFacts, ...], status: list[dict], kv_room: int | None
) -> tuple[RankFacts, ...]:
    """The ranks, each one's planned memory figures (`runtime_gb`, `needs_gb`, as the startup
    table and /cluster/status show them) raised to what its activations took in the warm-up,
    where that is more than planned; `measured_runtime_gb` says what was measured; its KV room
    and the most it holds (`kv_room_gb`, `most_gb`) for the `kv_room` tokens granted after the
    warm-up (`fit_room`; None: no bound, the plan's figures kept)."""
    out = []
    for rank, measured, planned in zip(
        ranks, activations_gib(status, weights_kib(ranks)), planned_runtime(ranks)
    ):
        view = replace(rank.planned, measured_runtime_gb=round(measured, 3))
        if measured > planned:
            view = replace(
                view,
                runtime_gb=round(measured, 3),
                needs_gb=round(view.needs_gb + measured - planned, 3),
            )
        if spec is not None and kv_room is not None:
            kv = kv_room_gb(spec, rank.layers[1] - rank.layers[0], view.cache_share, kv_room)
            view = replace(
                view,
                kv_room_gb=kv,
                most_gb=most_gb(
                    view.weights_gb,
                    view.runtime_gb,
                    kv,
                    view.prompt_cache_gb,
                    (view.disk_queue_gb or 0.0) + (view.restore_gb or 0.0),
                ),
            )
        out.append(replace(rank, planned=view))
    return tuple(out)


def peak_gib() -> float:
    """This process's MLX peak memory so far (the warm-up sets it on a GPU: it
    runs the largest batch)."""
    return mx.get_peak_memory() / 2**30


def warm_params() -> list[SamplingParams]:
    """The sampling settings the warm-up decodes batches with: on a GPU, where each way of
    sampling builds kernels of its own on first use, every one (`BATCHED`); on a CPU, greedy."""
    return [GREEDY] if mx.default_device() == mx.cpu else list(BATCHED)


def alone_params(grammar: bool) -> list[SamplingParams]:
    """The settings whose rows sample one by one, each a way of its own: a seed (with every
    filter), penalties, a logit bias, alternatives reported and (`grammar`) a grammar's mask."""
    return [
        SamplingParams(seed=1, top_p=0.9, min_p=0.05, top_k=40),
        SamplingParams(repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5),
        SamplingParams(logit_bias={0: 1.0, 1: -1.0}),
        SamplingParams(temperature=0.0, top_logprobs=2),
        *([SamplingParams(temperature=0.0, grammar=json_grammar(None))] if grammar else []),
    ]


def warm_mixed(
    sched: Scheduler,
    ids: itertools.count,
    prompt: list[int],
    rows: list[int],
    alone: list[SamplingParams],
    constrain=None,
    tokens: int = 2,
) -> float:
    """Each of `alone` (settings whose rows sample one by one) in a row of its own, then, at each
    of `rows` above one, a group whose rows take every setting in turn (`BATCHED`'s too: mixed,
    they sample one by one as well); returns the seconds it took. Nothing is left behind."""
    t0 = time.perf_counter()
    if alone:
        for p in alone:
            _decode_seconds(sched, ids, prompt, 1, tokens, p, constrain=constrain)
        for n in rows:
            if n > 1:
                _decode_seconds(sched, ids, prompt, n, tokens, BATCHED + alone, constrain=constrain)
    return time.perf_counter() - t0


def warm_lengths(chunk: int, nccl: bool) -> list[int]:
    """Prompt lengths warmed one by one: on CUDA every length up to a prefill chunk, since a
    matmul of a new shape is planned on first use (10-19 ms a prompt on an H100; decode steps of
    as many rows use the same shapes); elsewhere none. Where tensor mode sums over NCCL (`nccl`),
    only a whole chunk, for the activations' peak: the hundreds of CUDA graphs every length
    leaves, each holding NCCL's all_sums, slowed every later decode step there (15.8 against 12.1
    ms on 2 x H100)."""
    if not mx.cuda.is_available():
        return []
    return [chunk] if nccl else list(range(1, chunk + 1))


def warm_prompts(
    sched: Scheduler, ids: itertools.count, prompt: list[int], lengths: list[int]
) -> float:
    """Prefill one prompt of each of `lengths` (`prompt`'s tokens, repeated or cut), alone, on every
    rank; returns the seconds it took. Nothing is left behind, as with `warm_up`."""
    t0 = time.perf_counter()
    for n in lengths:
        _decode_seconds(sched, ids, (prompt * (n // len(prompt) + 1))[:n], 1, 1)
    return time.perf_counter() - t0


def warm_up(
    sched: Scheduler,
    ids: itertools.count,
    prompt: list[int],
    rows: list[int],
    tokens: int = 2,
    params: list[SamplingParams] = (GREEDY,),
) -> float:
    """Run `rows[i]` sequences of `prompt` at once, `tokens` tokens each, with each of `params` in
    turn, round by round, on every rank; returns the seconds it took. Nothing is left behind: not a
    cache row, not an entry in the prompt cache."""
    t0 = time.perf_counter()
    for n in rows:
        for p in params:
            _decode_seconds(sched, ids, prompt, n, tokens, p)
    return time.perf_counter() - t0


def seed_prompt_cache(sched: Scheduler, ids: itertools.count, prompt: list[int]) -> None:
    """Leave `prompt` (a short chat: the template around one message) in the prompt cache, so the
    first requests start from the template's shared start as later ones do, where it is long
    enough to reuse (`Scheduler.least_reuse`)."""
    if sched.prefix is not None:
        _decode_seconds(sched, ids, prompt, 1, 1, keep=True)


def _decode_seconds(
    sched: Scheduler,
    ids: itertools.count,
    prompt: list[int],
    n: int,
    tokens: int,
    params: SamplingParams | list[SamplingParams] = GREEDY,
    keep: bool = False,
    constrain=None,
) -> float:
    """Seconds `n` sequences of `prompt` took from the last one's first token to their last;
    `params`: theirs, or a list the rows take in turn. `keep`: the prompt cache keeps them (else
    nothing of them)."""
    each = params if isinstance(params, list) else [params]
    prefix, sched.prefix = sched.prefix, sched.prefix if keep else None
    try:
        count = {
            Sequence(next(ids), list(prompt), each[i % len(each)], constrain): 0 for i in range(n)
        }
        for s in count:
            sched.add(s)
        started = None
        while not sched.idle():
            for s, _ in sched.step():
                count[s] += 1
                if count[s] >= tokens:
                    sched.remove(s)
            if started is None and all(count.values()):
                started = time.perf_counter()
        return time.perf_counter() - started
    finally:
        sched.prefix = prefix


def choose_groups(
    sched: Scheduler, ids: itertools.count, prompt: list[int], rows: int, tokens: int = 8
) -> dict[int, float]:
    """Decode `rows` sequences in one group and in as many as the scheduler has, twice each (the
    first may build kernels), and keep the faster: several groups keep every rank at work, but
    each rank then runs a step per group, and where a step costs about the same for any number of
    rows (a GPU whose decode the host bounds) that costs more than the pipeline gains. Returns
    tokens/s per count tried."""
    counts = [len(sched.groups), 1]
    best = {g: 0.0 for g in counts}
    for g in counts * 2:
        sched.set_groups(g)
        best[g] = max(
            best[g], rows * (tokens - 1) / _decode_seconds(sched, ids, prompt, rows, tokens)
        )
    sched.set_groups(max(best, key=best.get))
    return best
