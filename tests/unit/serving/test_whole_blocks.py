"""The prompt cache of models whose layers are not all plain KV caches, in process on a ring of one:
LFM2 (a short convolution's state beside attention), Gemma 3 (sliding windows of 5 tokens, far
shorter than the prompts, beside global attention) and more kinds. Prefill chunks end at every
block boundary; a prompt that extends a cached one starts from its whole blocks, from RAM, from
disk and after a restart, and its logits and tokens equal single-process mlx-lm's for the whole
prompt."""

import json

import mlx.core as mx
import numpy as np
import pytest
from model_zoo import make
from ringutil import TINY, make_tiny_model, reference_logits

import mlx_ring.serving.runner as runner
from mlx_ring.cache import tiers
from mlx_ring.cache.disk import DiskTier
from mlx_ring.planning.plan import uniform_plan
from mlx_ring.ring.pipeline import Pipeline
from mlx_ring.ring.protocol import Kind
from mlx_ring.ring.transport import Ring
from mlx_ring.serving.params import SamplingParams
from mlx_ring.serving.scheduler import Scheduler, Sequence
from shard import load_shard

BLOCK, CHUNK, STEPS = 16, 12, 5
P = [
    (7 * i + 3) % 250 + 1 for i in range(40)
]  # two blocks and 8 tokens, ids every tiny vocabulary holds
X, Y, Z = list(range(11, 21)), list(range(201, 208)), list(range(101, 111))


def start(model, disk, ram: int, chunk: int = CHUNK, **lanes):
    """A fresh rank 0 (its RAM tier empty) over the disk folder `disk`, and a scheduler whose
    index holds `ram` tokens in RAM (`lanes`: the scheduler's other settings)."""
    n = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    shard = load_shard(model, uniform_plan(n, 1), 0)
    shard.block = BLOCK
    scope = tiers.scope(shard.held.salt, (0, n), (0, 1), "f32")
    shard.held.disk = DiskTier(disk, scope, 1 << 30, floor_bytes=0)
    prefix = tiers.block_index(ram, shard.held.salt, BLOCK, shard.held.disk, not shard.plain_kv)
    sched = Scheduler(
        Pipeline(shard, Ring(mx.distributed.init())), shard, chunk=chunk, prefix=prefix, **lanes
    )
    return shard, sched


def run(sched: Scheduler, prompts: list[list[int]], monkeypatch) -> tuple[list, list, list]:
    """Each prompt alone after the one before it: its tokens, the logits they came from, and the
    (offset, length) of every prefill chunk."""
    logits, chunks = {}, []

    def recording(real):
        def wrapped(samplers, rows):
            out = real(samplers, rows)
            if out is not None:
                for s, row in zip(samplers, np.array(rows.astype(mx.float32))):
                    logits.setdefault(id(s), []).append(row)
            return out

        return wrapped

    monkeypatch.setattr(runner, "sample_rows", recording(runner.sample_rows))
    monkeypatch.setattr(runner, "sample_lazy", recording(runner.sample_lazy))
    submit = sched.pipe.submit

    def noting(header, payload, *a):
        if header.kind == Kind.PREFILL:
            chunks.append((header.offset, header.shape[1]))
        return submit(header, payload, *a)

    sched.pipe.submit = noting
    tokens, rows = [], []
    for i, prompt in enumerate(prompts):
        seq, got = Sequence(i, prompt, SamplingParams(temperature=0.0)), []
        sched.add(seq)
        while not sched.idle():
            for s, token in sched.step():
                got.append(token.id)
                if len(got) == STEPS:
                    sched.remove(s)
        tokens.append(got[:STEPS])
        rows.append(np.stack(logits[id(seq.sampler)][:STEPS]))
    return tokens, rows, chunks


# LFM2 and Gemma 3 as tests/ringutil.py makes them, the others as the model matrix does: gated
# delta nets, a sliding window with attention sinks, and a layer's two caches (a state beside a
# window, a state beside attention)
@pytest.mark.parametrize(
    "kind", ["lfm2", "gemma3_text", "qwen3_next", "gpt_oss", "baichuan_m1", "falcon_h1"]
)
def test_a_prompt_restores_whole_blocks_from_ram_and_disk_and_decodes_as_mlx_lm(
    tmp_path, monkeypatch, kind
):
    model = make_tiny_model(tmp_path / kind, kind) if kind in TINY else make(kind, tmp_path / kind)
    shard, sched = start(model, tmp_path / "disk", ram=BLOCK)  # one block in RAM, both on disk
    assert not shard.plain_kv and sched.prefix.whole
    tokens, logits, chunks = run(sched, [P, P + X], monkeypatch)
    # every boundary ends a chunk; the second prompt starts from both blocks (one from disk)
    assert chunks == [(0, 12), (12, 4), (16, 12), (28, 4), (32, 8), (32, 12), (44, 4), (48, 2)]
    assert (sched.prefix.hit_tokens, sched.prefix.disk_tokens) == (32, 16)
    assert shard.prefill_tokens == 40 + 50 - 32
    shard.held.disk.close()
    # a restart: both blocks come back from disk
    shard, sched = start(model, tmp_path / "disk", ram=4 * BLOCK)
    again, again_logits, chunks = run(sched, [P + Y], monkeypatch)
    assert chunks == [(32, 12), (44, 3)] and sched.prefix.disk_tokens == 32
    # and from RAM, where the restart's prompt left them
    ram, ram_logits, chunks = run(sched, [P + Z], monkeypatch)
    assert chunks == [(32, 12), (44, 4), (48, 2)] and sched.prefix.disk_tokens == 32
    shard.held.disk.close()
    for prompt, got, rows in zip(
        [P, P + X, P + Y, P + Z], tokens + again + ram, logits + again_logits + ram_logits
    ):
        want, want_tokens = reference_logits(model, prompt, steps=STEPS)
        np.testing.assert_allclose(
            rows, want, rtol=1e-4, atol=1e-4, err_msg=f"a prompt of {len(prompt)} tokens"
        )
        assert got == want_tokens


def test_chunks_longer_than_a_block_are_cut_at_each_boundary(tmp_path, monkeypatch):
    model = make_tiny_model(tmp_path / "lfm2", "lfm2")
    shard, sched = start(model, tmp_path / "disk", ram=4 * BLOCK, chunk=40)
    tokens, logits, chunks = run(sched, [P, P + X], monkeypatch)
    assert chunks == [(0, 16), (16, 16), (32, 8), (32, 16), (48, 2)]
    shard.held.disk.close()
    for prompt, got, rows in zip([P, P + X], tokens, logits):
        want, want_tokens = reference_logits(model, prompt, steps=STEPS)
        np.testing.assert_allclose(rows, want, rtol=1e-4, atol=1e-4)
        assert got == want_tokens


def test_blocks_are_saved_as_their_chunks_come_home(tmp_path, monkeypatch):
    """So a rank holds the states it noted for the chunks on the ring only, not for the whole
    prompt: here 12 tokens of chunks at a time (the prefill budget)."""
    model = make_tiny_model(tmp_path / "lfm2", "lfm2")
    shard, sched = start(model, tmp_path / "disk", ram=4 * BLOCK, prefill_budget=CHUNK)
    steps, held, submit = [], [], sched.pipe.submit

    def noting(header, payload, *a):
        steps.append((Kind(header.kind).name, header.offset))
        held.append(max((len(k.states) for k in shard.kept.values()), default=0))
        return submit(header, payload, *a)

    sched.pipe.submit = noting
    tokens, logits, _ = run(sched, [P], monkeypatch)
    forward = [s for s in steps if s[0] in ("PREFILL", "SAVE")]
    assert forward == [
        ("PREFILL", 0),
        ("PREFILL", 12),
        ("SAVE", BLOCK),  # the first block, once its last chunk is home
        ("PREFILL", 16),
        ("PREFILL", 28),
        ("PREFILL", 32),  # 4 + 8 tokens fit the budget
        ("SAVE", BLOCK),
    ]
    assert max(held) == 1 and not shard.kept
    assert sched.prefix.lookup(P + X).tokens == 32
    shard.held.disk.close()
    want, want_tokens = reference_logits(model, P, steps=STEPS)
    np.testing.assert_allclose(logits[0], want, rtol=1e-4, atol=1e-4)
    assert tokens[0] == want_tokens


def test_the_ram_budget_counts_each_blocks_fixed_states_as_tokens_of_as_many_bytes(tmp_path):
    from mlx_lm.models.cache import ArraysCache

    from mlx_ring.config import parse_config
    from mlx_ring.planning.cluster import Cluster, RankFacts
    from mlx_ring.planning.sizes import spec_from_folder
    from mlx_ring.serving.startup import prompt_cache

    argv = ["--prompt-cache-gb", "0.001", "--prompt-disk-gb", "0", "--prompt-cache-block", "16"]
    cfg = parse_config(argv)[0]
    for kind in ("llama", "lfm2"):
        model = make_tiny_model(tmp_path / kind, kind)
        shard = load_shard(model, uniform_plan(7, 1), 0)
        # the dry run's figure is what a real prefill's convolution states hold
        caches = shard.slice.new_caches()
        mx.eval(shard.slice.forward(mx.array([P]), caches))
        assert shard.state_bytes == sum(c.nbytes for c in caches if isinstance(c, ArraysCache))
        per_token = spec_from_folder(model).kv_bytes_per_token * 7 + shard.state_bytes / 16
        index = prompt_cache(
            cfg, shard, spec_from_folder(model), Cluster((RankFacts.of(shard.info()),))
        )
        assert index.budget == int(0.001 * 2**30 / per_token) and index.whole == (kind == "lfm2")
    assert shard.state_bytes > 0
