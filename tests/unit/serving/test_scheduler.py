"""The scheduler in process, on a ring of one (no mlx.launch): sequences that arrive and leave
mid-flight, share prefill and decode steps, and still decode exactly what single-process mlx-lm
decodes for each of them alone."""

import mlx.core as mx
from ringutil import make_tiny_model, reference_logits
from schedulerutil import decode_all

from mlx_ring.planning.plan import uniform_plan
from mlx_ring.ring.pipeline import Pipeline
from mlx_ring.ring.transport import Ring
from mlx_ring.serving.params import SamplingParams
from mlx_ring.serving.scheduler import Scheduler, Sequence
from shard import load_shard


def test_interleaved_sequences_decode_as_each_alone(tmp_path):
    model = make_tiny_model(tmp_path / "model", "llama")
    shard = load_shard(model, uniform_plan(7, 1), 0)
    sched = Scheduler(Pipeline(shard, Ring(mx.distributed.init())), shard, groups=2, chunk=8)
    # (prompt, tokens wanted, the step it arrives at): a long prompt goes in chunks of 8
    spec = [
        ([5, 17, 42], 6, 0),
        ([9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12, 13, 14, 15, 16, 17, 18, 19], 5, 0),
        ([250, 3], 4, 2),
        ([100, 101, 102, 103], 7, 5),
    ]
    seqs = [
        Sequence(i + 1, prompt, SamplingParams(temperature=0.0))
        for i, (prompt, _, _) in enumerate(spec)
    ]
    got = {s.id: [] for s in seqs}
    step = 0
    while step <= max(at for _, _, at in spec) or not sched.idle():
        for s, (_, _, at) in zip(seqs, spec):
            if at == step:
                sched.add(s)
        for s, token in sched.step():
            got[s.id].append(token.id)
            if len(got[s.id]) == spec[s.id - 1][1]:
                sched.remove(s)  # leaves mid-flight; its rows go before its group's next step
        step += 1
    for s, (prompt, n, _) in zip(seqs, spec):
        assert got[s.id] == reference_logits(model, prompt, n)[1], f"sequence {s.id}"
    assert shard.status_row().open_sequences == 0  # every cache freed


def test_a_draft_model_rests_in_a_group_of_more_than_four_rows(tmp_path):
    from mlx_lm.utils import load_model

    from mlx_ring.ring.protocol import Kind
    from mlx_ring.serving.speculative import MODEL_DRAFT_ROWS

    model = make_tiny_model(tmp_path / "model", "llama")
    shard = load_shard(model, uniform_plan(7, 1), 0)
    drafter = load_model(model)[0]  # the model drafting for itself: every greedy draft is right
    pipe = Pipeline(shard, Ring(mx.distributed.init()))
    sched = Scheduler(pipe, shard, chunk=8, draft_tokens=3, draft_model=drafter)
    decodes, submit = [], pipe.submit
    pipe.submit = lambda header, payload, *a: (
        header.kind == Kind.DECODE and decodes.append(payload.shape[:2]),
        submit(header, payload, *a),
    )
    prompts = [[5, 17, 42], [9, 8, 7], [250, 3], [100, 101, 102], [7, 7, 7], [1, 2]]
    # rows leave one by one: the group shrinks past 4
    wanted = [4 + 3 * i for i in range(len(prompts))]
    got = decode_all(sched, prompts, wanted)
    assert all(width == 1 for rows, width in decodes if rows > MODEL_DRAFT_ROWS), decodes
    assert any(width > 1 for rows, width in decodes if rows == MODEL_DRAFT_ROWS), decodes
    assert any(rows > MODEL_DRAFT_ROWS for rows, _ in decodes), decodes
    for i, p in enumerate(prompts):
        assert got[i][: wanted[i]] == reference_logits(model, p, wanted[i])[1], i


def test_a_step_goes_out_ahead_when_no_row_could_draft_after_it(tmp_path, monkeypatch):
    """Prompt lookup needs a step's tokens read before it drafts the next; where the last token
    never occurred before, no lookup can match, so the next step goes out before they are read
    (as without drafts). The same tokens either way, with more steps out ahead."""
    from mlx_ring.serving.speculative import Drafter

    model = make_tiny_model(tmp_path / "model", "llama")
    shard = load_shard(model, uniform_plan(7, 1), 0)
    prompts = [[5, 17, 42], [9, 8, 7], [100, 101, 102]]

    def run():
        pipe = Pipeline(shard, Ring(mx.distributed.init()))
        sched, ahead, submit = Scheduler(pipe, shard, chunk=8, draft_tokens=3), [], pipe.submit
        pipe.submit = lambda header, payload, tag=None, chained=False: (
            ahead.append(chained),
            submit(header, payload, tag, chained),
        )
        return decode_all(sched, prompts, [12] * len(prompts)), sum(ahead)

    got, ahead = run()
    # as if any row could draft
    monkeypatch.setattr(Drafter, "may_propose_next", lambda self, history: True)
    got_always, ahead_always = run()
    assert got == got_always and ahead > ahead_always, (ahead, ahead_always)
    for s, p in enumerate(prompts):
        assert got[s][:12] == reference_logits(model, p, 12)[1]


def test_prefill_attending_unfused_as_on_cuda_decodes_the_same(tmp_path, monkeypatch):
    """On CUDA, prefill chunks over few keys attend with plain matmuls (a new prompt
    length would build the fused kernel anew): lone prompts, a padded batch and a later
    chunk all decode as alone."""
    import shard as shard_module
    from mlx_ring.models import compat

    model = make_tiny_model(tmp_path / "model", "llama")
    shard = load_shard(model, uniform_plan(7, 1), 0)
    calls, attention = [], compat._attention
    monkeypatch.setattr(
        compat,
        "_attention",
        lambda q, *a, **kw: (calls.append(q.shape[2]), attention(q, *a, **kw))[1],
    )
    monkeypatch.setattr(shard_module, "UNFUSED_SEVERAL", True)
    # a long prompt's later chunks: fused
    monkeypatch.setattr(shard_module, "UNFUSED_PREFILL_KEYS", 12)
    prompts = [
        [5, 17, 42],
        [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12, 13, 14, 15, 16, 17, 18, 19],
        [250, 3],
        [100, 101, 102],
    ]
    got = decode_all(
        Scheduler(Pipeline(shard, Ring(mx.distributed.init())), shard, chunk=8),
        prompts,
        [5] * len(prompts),
    )
    for i, p in enumerate(prompts):
        assert got[i][:5] == reference_logits(model, p, 5)[1], i
    # Prefill chunks only (decode keeps the fused kernel), and of the long prompt's three chunks of
    # up to 8 only the first: the others attend over 16 and 18 keys.
    assert sorted(set(calls)) == [3, 8] and calls.count(8) == 7, calls


def test_every_prompt_length_is_warmed_on_cuda_but_one_chunk_where_tensor_mode_sums_over_nccl(
    monkeypatch,
):
    from mlx_ring.serving import warmup

    # this CPU: none
    assert warmup.warm_lengths(4, nccl=False) == [] == warmup.warm_lengths(4, nccl=True)
    monkeypatch.setattr(warmup.mx.cuda, "is_available", lambda: True)
    assert warmup.warm_lengths(4, nccl=False) == [1, 2, 3, 4]
    # a whole chunk, for the peak: more graphs slow every step there
    assert warmup.warm_lengths(4, nccl=True) == [4]


def test_warm_up_leaves_no_row_and_only_the_seeded_prompt_cache_entry(tmp_path):
    import itertools

    from mlx_ring.cache.blocks import BlockIndex
    from mlx_ring.serving.warmup import seed_prompt_cache, warm_prompts, warm_up

    model = make_tiny_model(tmp_path / "model", "llama")
    shard = load_shard(model, uniform_plan(7, 1), 0)
    prefix = BlockIndex(4096, block=16)
    sched = Scheduler(Pipeline(shard, Ring(mx.distributed.init())), shard, chunk=8, prefix=prefix)
    ids = itertools.count(1)
    # greedy; temperature 1, no logprobs
    params = [SamplingParams(temperature=0.0), SamplingParams(logprobs=False)]
    warm_up(sched, ids, [5, 17, 42, 9, 8, 7, 6, 5, 4, 3], [1, 2, 4], params=params)
    assert sched.idle() and shard.status_row().open_sequences == 0
    assert sched.prefix is prefix and prefix.lookup([5, 17, 42, 9, 8, 7, 6, 5, 4, 3]).tokens == 0
    assert next(ids) == 15  # 2 x (1 + 2 + 4) sequences took their ids from the engine's count
    prefilled = shard.prefill_tokens
    # cut and repeated: 12 is 5, 17, 42 four times
    warm_prompts(sched, ids, [5, 17, 42], [1, 2, 7, 12])
    assert shard.prefill_tokens - prefilled == 1 + 2 + 7 + 12 and next(ids) == 20
    assert (
        sched.idle()
        and shard.status_row().open_sequences == 0
        and prefix.lookup([5, 17, 42] * 4).tokens == 0
    )
    # kept: a later prompt starts from its shared start
    seed_prompt_cache(sched, ids, [5, 17, 42, 9, 8, 7, 6, 5, 4, 3])
    assert sched.idle() and shard.status_row().open_sequences == 0
    assert prefix.lookup([5, 17, 42, 9, 8, 7, 1, 2]).tokens == 6
    hit, miss = (
        Sequence(n, p, SamplingParams(temperature=0.0))
        for n, p in ((90, [5, 17, 42, 9, 8, 7, 1, 2]), (91, [250, 3, 4]))
    )
    for seq in (hit, miss):
        sched.add(seq)
    while not sched.idle():
        for seq, _ in sched.step():
            sched.remove(seq)
    assert (hit.cached, miss.cached) == (6, 0)  # what usage reports as cached tokens


def test_after_the_warm_up_each_ranks_memory_beyond_the_plans_runtime_is_measured(tmp_path):
    import itertools

    from mlx_ring.planning.cluster import Planned, RankFacts
    from mlx_ring.serving.warmup import activations_gib, count_measured, rank_memory, warm_up

    model = make_tiny_model(tmp_path / "model", "llama")
    # resets the process's peak: other tests ran in it before
    shard = load_shard(model, uniform_plan(7, 1), 0)
    # the shard's weights, and whatever else this process still holds
    held_kib = mx.get_active_memory() >> 10
    sched = Scheduler(Pipeline(shard, Ring(mx.distributed.init())), shard, chunk=8)
    warm_up(sched, itertools.count(1), [5, 17, 42, 9], [1, 2])
    status = rank_memory(sched)  # one STATUS step round the ring (of one)
    assert sched.idle() and [r["rank"] for r in status] == [0]
    row = status[0]
    assert (
        row["mlx_peak_memory_kib"] >= shard.info()["parameter_bytes"] >> 10
        and row["kv_cache_peak_kib"] > 0
    )
    (taken,) = activations_gib(status, [held_kib])
    assert taken < 0.5  # a tiny model's activations are small
    # Counted without its weights: its peak less the caches it held.
    (took,) = activations_gib(status, [0])
    assert (
        took * 2**20
        == row["mlx_peak_memory_kib"] - row["kv_cache_peak_kib"] - row["prompt_cache_kib"]
        > 0
    )
    # The plan's figures count what was measured where it is more than planned, and only there.
    ranks = (RankFacts(0, "here", (0, 7), planned=Planned(runtime_gb=took / 2, needs_gb=1.0)),)
    (counted,) = count_measured(None, ranks, status, None)
    assert counted.planned == Planned(
        runtime_gb=round(took, 3),
        needs_gb=round(1.0 + took / 2, 3),
        measured_runtime_gb=round(took, 3),
    )
    ranks = (
        RankFacts(
            0,
            "here",
            (0, 7),
            parameter_bytes_kib=held_kib,
            planned=Planned(runtime_gb=0.5, needs_gb=1.0),
        ),
    )
    (counted,) = count_measured(None, ranks, status, None)
    assert counted.planned.runtime_gb == 0.5 and counted.planned.needs_gb == 1.0


def test_a_prompt_waits_for_room_in_the_kv_cache(tmp_path):
    """With room for one sequence's cache (its prompt + max_tokens, and the room a cache grows
    by), a second prompt starts only once the first has left; with room for both they decode
    together. Each decodes what mlx-lm decodes for it alone either way."""
    model = make_tiny_model(tmp_path / "model", "llama")
    shard = load_shard(model, uniform_plan(7, 1), 0)
    prompts = [[5, 17, 42, 99, 3], [8, 1, 7, 7, 2]]
    want = [reference_logits(model, p, 6)[1] for p in prompts]
    # One row: 1 x (5 + 6 + 16) = 27; two in one group: 2 x (11 + 16) = 54, counted
    # twice (growing copies it).
    for kv_room, together in ((27, False), (107, False), (108, True)):
        sched = Scheduler(
            Pipeline(shard, Ring(mx.distributed.init())),
            shard,
            chunk=8,
            kv_room=kv_room,
            kv_spare=16,
        )
        seqs = [
            Sequence(i, p, SamplingParams(temperature=0.0), max_tokens=6)
            for i, p in enumerate(prompts)
        ]
        got, steps = {0: [], 1: []}, {0: [], 1: []}
        for s in seqs:
            sched.add(s)
        step = 0
        while not sched.idle():
            for s, token in sched.step():
                got[s.id].append(token.id)
                steps[s.id].append(step)
                if len(got[s.id]) == 6:
                    sched.remove(s)
            step += 1
        assert [got[0], got[1]] == want, kv_room
        assert (steps[1][0] < steps[0][-1]) == together, (kv_room, steps)
        assert shard.status_row().open_sequences == 0 and not sched.prefilling


def test_a_prefill_shows_its_chunks_as_they_come_home(tmp_path):
    model = make_tiny_model(tmp_path / "model", "llama")
    shard = load_shard(model, uniform_plan(7, 1), 0)
    sched = Scheduler(Pipeline(shard, Ring(mx.distributed.init())), shard, chunk=8)
    seq = Sequence(1, list(range(1, 21)), SamplingParams(temperature=0.0))  # 3 chunks: 8, 8, 4
    sched.add(seq)
    seen = []
    while not seq.prefilled:
        sched.schedule()
        seen.append([(s.id, done) for b in sched.prefilling for s, done in b.progress()])
        sched.step()
    assert seen == [[(1, 0)], [(1, 8)], [(1, 16)]] and not sched.prefilling
