"""Receiving prefill and decode payloads apart, before the stage is built on them (what a rank
does on Metal, forced here on a CPU with RECEIVE_APART=on), computes exactly what
single-process mlx-lm computes."""

import json

import numpy as np
from ringutil import ROOT, launch, make_tiny_model, reference_logits

DRIVER = str(ROOT / "tests" / "apart_driver.py")


def test_prefill_and_decode_received_apart_match_mlx_lm(tmp_path):
    model = make_tiny_model(tmp_path / "model", "qwen3", n_layers=5)
    spec = [
        {"prompt": [5, 17, 42, 99, 3, 250, 7], "max_tokens": 6, "at": 0},  # one chunk
        # 19 tokens: 3 chunks, beside decode steps
        {"prompt": list(range(30, 49)), "max_tokens": 5, "at": 2},
    ]
    launch(
        2,
        tmp_path,
        [
            DRIVER,
            "--model",
            str(model),
            "--spec",
            json.dumps(spec),
            "--groups",
            "2",
            "--chunk",
            "8",
            "--layers",
            "2,3",
            "--out",
            str(tmp_path),
        ],
        env={"RECEIVE_APART": "on"},
    )
    result = json.loads((tmp_path / "result.json").read_text())
    for i, s in enumerate(spec):
        want, want_tokens = reference_logits(model, s["prompt"], steps=s["max_tokens"])
        logits = np.load(tmp_path / f"logits{i}.npy")
        # several chunks: float rounding of other shapes, as in test_fidelity
        tol = 1e-5 if i == 0 else 1e-4
        np.testing.assert_allclose(logits, want, rtol=tol, atol=tol, err_msg=f"sequence {i}")
        assert result["tokens"][i] == want_tokens, f"sequence {i}"
    seen = [json.loads((tmp_path / f"apart{r}.json").read_text()) for r in range(2)]
    # rank 1 received every prefill chunk and every decode step apart, and rank 0
    # each decode step back
    assert seen[1].get("PREFILL apart", 0) == len(result["prefill_rows"]) >= 4, seen
    assert seen[1].get("DECODE apart", 0) == len(result["decode_rows"]) > 0, seen
    assert not any(k.endswith("in graph") for k in seen[0] | seen[1]), seen
    assert seen[0].get("DECODE apart", 0) == len(result["decode_rows"]), seen
