"""tools/bench_chain.py on real 2-rank rings, tensor mode and pipeline: with every request feature,
and with rows joining and leaving, the scheduler sends at least 95% of decode steps chained (built
on ids not yet read). How the workers waited is printed (a matter of timing)."""

import json
import re

import pytest
from ringutil import launch, make_tiny_model

LINE = re.compile(
    r"^(\w+) 2 ranks, (.+): (\d+) DECODE steps, chained (\d+)/\d+, "
    r"(no worker waited \d+/\d+|a worker idle [\d.]+ ms a step), period [\d.]+ ms$"
)
SCENARIOS = 8


@pytest.mark.parametrize("mode", ["tensor", "pipeline"])
def test_decode_steps_chain_with_every_feature_on_a_real_ring(tmp_path, default_model, mode):
    vocab = json.loads((default_model / "config.json").read_text())["vocab_size"]
    model = make_tiny_model(tmp_path / "m", "llama", n_layers=4, vocab_size=vocab)
    args = ["tools/bench_chain.py", "--model", str(model), "--tokenizer", str(default_model)]
    args += ["--mode", mode, "--tokens", "48", "--trace", str(tmp_path / "trace.json")]
    proc = launch(2, tmp_path, args, timeout=400)
    lines = [m for ln in proc.stdout.splitlines() if (m := LINE.match(ln))]
    print("\n".join(m.group(0) for m in lines))
    assert len(lines) == SCENARIOS, proc.stdout[-3000:]
    names = [m.group(2) for m in lines]
    assert "json_schema" in names and "joining and leaving" in names, names
    for m in lines:
        decode, chained = int(m.group(3)), int(m.group(4))
        assert m.group(1) == mode and decode > 40 and chained >= 0.95 * decode, m.group(0)
