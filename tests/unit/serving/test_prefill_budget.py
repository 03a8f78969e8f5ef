"""A burst of prompts is prefilled within the tokens the plan's activation figure counts:
the scheduler keeps no more prompt tokens (rows x chunk, over every prefill batch) on the
device at once, on a ring of one (no mlx.launch), still batching short prompts and
decoding what mlx-lm decodes."""

import mlx.core as mx
from ringutil import make_tiny_model, reference_logits
from schedulerutil import decode_all

from mlx_ring.planning.plan import uniform_plan
from mlx_ring.ring.pipeline import Pipeline
from mlx_ring.ring.protocol import Kind
from mlx_ring.ring.transport import Ring
from mlx_ring.serving.scheduler import Scheduler
from shard import load_shard

# 20 tokens: alone, in chunks of 8
LONG = [[(7 * i + j) % 250 + 1 for j in range(20)] for i in range(4)]
SHORT = [[100 + i, 3, 9] for i in range(6)]  # 3 tokens: two to a batch of 8


def run(
    shard, budget: int, step: int = 0, prompts=None
) -> tuple[dict[int, list[int]], int, list[int]]:
    """Greedy tokens of every prompt, all queued at once; the most prompt tokens on the device at
    once; the rows of each PREFILL step (`step`: its tokens, rows x chunk; 0: one chunk)."""
    pipe = Pipeline(shard, Ring(mx.distributed.init()))
    sched = Scheduler(pipe, shard, chunk=8, prefill_budget=budget, prefill_step=step)
    most, rows, submit = [0], [], pipe.submit

    def watched(header, payload, *a):
        submit(header, payload, *a)
        if header.kind == Kind.PREFILL:
            rows.append(payload.shape[0])
        most[0] = max(most[0], sched.prefill_out)

    pipe.submit = watched
    prompts = prompts or LONG + SHORT
    got = decode_all(sched, prompts, [3] * len(prompts))
    assert sched.prefill_out == 0
    return got, most[0], rows


def test_a_burst_is_prefilled_within_the_budget_and_decodes_as_each_alone(tmp_path):
    model = make_tiny_model(tmp_path / "model", "llama")
    shard = load_shard(model, uniform_plan(7, 1), 0)
    got, most, rows = run(shard, 16)
    assert most == 16  # two chunks of 8 at a time, never more
    assert rows.count(2) == 3  # the short prompts still go two to a step
    for i, p in enumerate(LONG + SHORT):
        assert got[i] == reference_logits(model, p, 3)[1], i
    # Without the cap a ring of one queues the whole burst's chunks at once.
    unbounded, most, _ = run(shard, 0)
    assert most > 16 and unbounded == got
    # A budget under a chunk still lets one chunk go at a time.
    _, most, _ = run(shard, 5)
    assert most == 8


def test_where_a_step_may_hold_several_chunks_long_prompts_are_prefilled_together(tmp_path):
    """A CUDA rank's plan grants steps of several chunks (activations.step_tokens): a burst of
    long prompts then goes as few steps of several rows, each within the step's tokens and the
    budget, and decodes what each prompt decodes alone."""
    model = make_tiny_model(tmp_path / "model", "llama")
    shard = load_shard(model, uniform_plan(7, 1), 0)
    alone, _, rows = run(shard, 8, prompts=LONG)
    assert rows == [1] * 12  # before: each 20-token prompt alone, 3 chunks each
    got, most, rows = run(shard, 16, 16, prompts=LONG)
    # two prompts' chunks a step, one step on the device at once
    assert rows == [2] * 6 and most == 16
    assert got == alone
    for i, p in enumerate(LONG):
        assert got[i] == reference_logits(model, p, 3)[1], i
    # A budget of two steps lets the second batch start while the first's step is out,
    # within what is left.
    _, most, rows = run(shard, 24, 16, prompts=LONG)
    assert most <= 24 and max(rows) == 2


def test_prompts_prefilled_together_end_in_the_same_chunk(tmp_path):
    """Rank 0 reads a batch's first tokens from its last chunk, and right padding beside prompts
    longer than a chunk would cost whole steps: a prompt joins a batch only where it ends in the
    batch's last chunk."""
    model = make_tiny_model(tmp_path / "model", "llama")
    shard = load_shard(model, uniform_plan(7, 1), 0)
    mixed = [*SHORT[:3], LONG[0]]
    got, _, rows = run(shard, 32, 32, prompts=mixed)
    # the short ones in one step; the long one after them, alone (not 4 rows x 3 steps)
    assert rows == [3, 1, 1, 1]
    for i, p in enumerate(mixed):
        assert got[i] == reference_logits(model, p, 3)[1], i
    # 17 tokens end in the 20's last chunk of 8, 15 do not
    near = [LONG[0], LONG[1][:17], LONG[2][:15]]
    got, _, rows = run(shard, 32, 32, prompts=near)
    assert rows == [2, 2, 2, 1, 1]
    for i, p in enumerate(near):
        assert got[i] == reference_logits(model, p, 3)[1], i
