"""The prompt cache's blocks on every rank's disk: a prompt that starts like one a ring saw before,
in this run or before a restart, starts from the blocks every rank reads back, and its logits equal
single-process mlx-lm's for the whole prompt; a rank whose blocks are spoilt makes it prefill
everything, still exact. Pipeline and tensor mode, 2 and 3 ranks, one launch per rank count."""

import json

import numpy as np
import pytest
from probeutil import DRIVER, read_probe
from ringutil import launch, make_tiny_model, reference_logits

P = [(7 * i + 3) % 300 + 1 for i in range(40)]  # two blocks of 16 and a tail of 8
X, Y = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [201, 202, 203, 204, 205, 206, 207]
# the RAM tier holds one block: the second comes back from disk
FIRST = [
    {"prompt": P, "max_tokens": 3, "at": 0},
    {"prompt": P + X, "max_tokens": 4, "after": 0},
]
AGAIN = [{"prompt": P + Y, "max_tokens": 4, "at": 0}]  # after a restart: both blocks from disk
# (name, spec, RAM tokens, ranks whose blocks are cut short first, tokens every rank prefills,
# tokens from disk)
RUNS = [
    ("first", FIRST, 16, [], 40 + (50 - 32), 16),
    ("restart", AGAIN, 16, [], 47 - 32, 32),
    ("spoilt", AGAIN, 0, [1], 47, 0),
]
MODES = ("pipeline", "tensor")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """{(ranks, mode, run name): its output folder}, and the model, each mode's runs in order over
    one disk folder per rank: one launch per rank count."""
    tmp = tmp_path_factory.mktemp("blocks")
    model = make_tiny_model(tmp / "llama", "llama")
    outs = {}
    for n in (2, 3):
        cases, folders = [], []
        for mode in MODES:
            for name, spec, ram, spoil, _, _ in RUNS:
                folder = tmp / str(n) / mode / name
                folder.mkdir(parents=True)
                outs[n, mode, name] = folder
                folders.append(str(folder))
                case = {"spec": spec, "chunk": 16, "prompt_cache": ram, "parallel": mode}
                cases.append(case | {"disk": str(tmp / str(n) / mode / "disk"), "spoil": spoil})
        argv = [DRIVER, "--model", *[str(model)] * len(cases), "--out", *folders]
        argv += ["--case", *map(json.dumps, cases)]
        launch(n, tmp / str(n), argv, timeout=120 + 40 * len(cases))
    return {"outs": outs, "model": model}


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("mode", MODES)
def test_blocks_on_disk_restore_exact_logits_and_a_spoilt_block_is_prefilled(runs, n, mode):
    for name, spec, _, _, prefilled, from_disk in RUNS:
        out = runs["outs"][n, mode, name]
        tokens, logits, status, _ = read_probe(out, n, spec)
        for i, s in enumerate(spec):
            want, want_tokens = reference_logits(runs["model"], s["prompt"], steps=s["max_tokens"])
            np.testing.assert_allclose(
                logits[i], want, rtol=1e-4, atol=1e-4, err_msg=f"{name} sequence {i}"
            )
            assert tokens[i] == want_tokens, (name, i)
        assert [r["prefill_tokens"] for r in status] == [prefilled] * n, name
        cache = json.loads((out / "result.json").read_text())["prompt_cache"]
        assert cache["disk_tokens"] == from_disk, (name, cache)
