"""After the warm-up a GPU runs, a request of any sampling setting, with values the warm-up never
used, builds no kernel: the warm-up runs every way a row samples (batched, row by row, mixed in
one group) at its batch sizes, and the settings reach MLX as arrays, not as constants compiled in
(serving/draws.py). Seen through the kernels MLX's CPU backend compiles: each one a shared library
in a folder of the temporary directory, so a fresh one counts them (in a process of its own, which
no other test's kernels serve from memory). The CPU compiles only what `mx.compile` fuses, where a
GPU builds its other kernels on first use too: so the ways each row sampled in the warm-up, as on
a GPU, are recorded as well."""

import json
import subprocess
import sys

from ringutil import make_tiny_model

from mlx_ring.config import ROOT

RUN = """
import glob, itertools, json, os, sys
import mlx.core as mx
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load_tokenizer
from mlx_ring.planning.plan import uniform_plan
from mlx_ring.ring.pipeline import Pipeline
from mlx_ring.ring.transport import Ring
from mlx_ring.serving import warmup
from mlx_ring.serving.grammar import Grammars
from mlx_ring.serving.grammar_text import json_grammar
from mlx_ring.serving.params import SamplingParams as P
from mlx_ring.serving.scheduler import Scheduler
from shard import load_shard

def built():
    return len(glob.glob(os.path.join(os.environ["TMPDIR"], "mlx", "*", "cpu", "*.so")))

model, tokenizer = sys.argv[1], load_tokenizer(sys.argv[2])
shard = load_shard(model, uniform_plan(2, 1), 0)
sched = Scheduler(Pipeline(shard, Ring(mx.distributed.init())), shard)
constrain = Grammars(tokenizer, 49152).processor
ids, prompt, rows = itertools.count(1), [5, 17, 42, 9, 8, 7], [1, 2]
# what warm() runs on a GPU, for MAX_ACTIVE=2
warmup.warm_up(sched, ids, prompt, rows, params=warmup.BATCHED)
warmup.warm_mixed(sched, ids, prompt, rows, warmup.alone_params(True), constrain)
warm = built()
schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
asked = [
    P(temperature=0.7), P(temperature=0.3, logprobs=False), P(top_p=0.5), P(min_p=0.2),
    P(top_k=5), P(temperature=1.4, top_p=0.7, min_p=0.1, top_k=9),
    P(seed=77, temperature=0.6, top_p=0.6), P(repetition_penalty=1.3), P(frequency_penalty=0.2),
    P(presence_penalty=-0.4), P(logit_bias={7: 2.0, 9: -3.0, 11: 1.0}), P(top_logprobs=5),
    P(temperature=0.5, grammar=json_grammar(schema)),
]
after = {}
for n, p in [(1, p) for p in asked] + [(2, P(top_p=0.6)), (2, [P(temperature=0.8), P(top_k=3)])]:
    before = built()
    warmup._decode_seconds(sched, ids, [3, 4, 5, 6], n, 4, p, constrain=constrain)
    after[f"{n} x {p!r}"] = built() - before
# mlx-lm's own sampler, a new temperature compiled in: the count does see a new kernel
seen = built()
mx.eval(make_sampler(0.45)(mx.random.normal((1, 49152))))
print(json.dumps({"warm": warm, "after": after, "constant": built() - seen}))
"""


def test_after_the_warm_up_no_sampling_setting_builds_a_kernel(default_model, tmp_path):
    tiny = make_tiny_model(tmp_path / "model", "llama", n_layers=2, vocab_size=49152)
    (tmp_path / "tmp").mkdir()
    p = subprocess.run(
        [sys.executable, "-c", RUN, str(tiny), str(default_model)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path / "tmp"), "HF_HUB_OFFLINE": "1"},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    seen = json.loads(p.stdout.splitlines()[-1])
    assert seen["warm"] > 0, "the warm-up compiled nothing: the count sees no kernel"
    assert seen["constant"] > 0, "a constant compiled in was not seen"
    new = {asked: n for asked, n in seen["after"].items() if n}
    assert not new, f"kernels built after the warm-up, by setting: {new}"


def test_the_warm_up_on_a_gpu_samples_every_way_at_every_batch_size(
    default_model, tmp_path, monkeypatch, caplog
):
    import itertools
    import logging

    import mlx.core as mx
    from mlx_lm.utils import load_tokenizer

    from mlx_ring.planning.plan import uniform_plan
    from mlx_ring.ring.pipeline import Pipeline
    from mlx_ring.ring.transport import Ring
    from mlx_ring.serving import runner, warmup
    from mlx_ring.serving.grammar import Grammars
    from mlx_ring.serving.sampling import SequenceSampler
    from mlx_ring.serving.scheduler import Scheduler
    from shard import load_shard

    tiny = make_tiny_model(tmp_path / "model", "llama", n_layers=2, vocab_size=49152)
    shard = load_shard(tiny, uniform_plan(2, 1), 0)
    sched = Scheduler(Pipeline(shard, Ring(mx.distributed.init())), shard)
    batched, alone, mixed = set(), set(), set()  # settings (repr: a logit bias is a dict)
    sample, logprobs, sample_rows = (
        SequenceSampler.sample,
        SequenceSampler.logprobs,
        runner.sample_rows,
    )

    def sampled(s, lp):  # a batch's call, or a row's own
        batched.add((repr(s.params), lp.shape[0]))
        return sample(s, lp)

    def processed(s, logits):  # a row sampled one by one, its processors applied
        alone.add(repr(s.params))
        return logprobs(s, logits)

    def rows(samplers, logits):
        if len({repr(s.params) for s in samplers}) > 1:
            mixed.add(len(samplers))
        return sample_rows(samplers, logits)

    monkeypatch.setattr(SequenceSampler, "sample", sampled)
    monkeypatch.setattr(SequenceSampler, "logprobs", processed)
    monkeypatch.setattr(runner, "sample_rows", rows)
    # as on a GPU: every batch size up to MAX_ACTIVE, every setting (MLX still computes here)
    monkeypatch.setattr(warmup.mx, "default_device", lambda: mx.Device(mx.gpu))
    constrain = Grammars(load_tokenizer(default_model), 49152).processor
    with caplog.at_level(logging.INFO, logger=warmup.__name__):
        warmup.warm(sched, itertools.count(1), [5, 17, 42, 9], 4, 8, False, False, constrain)
    sizes = [1, 2, 4]
    assert {(repr(p), n) for p in warmup.BATCHED for n in sizes} - batched == set()
    assert {repr(p) for p in warmup.alone_params(True)} - alone == set()
    assert {2, 4} <= mixed
    assert sched.idle() and shard.status_row().open_sequences == 0
    assert "sequences at once; 7 sampling settings batched, 5 sampled row by row" in caplog.text
