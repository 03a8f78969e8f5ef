"""Steps in fixed-size frames (what a ring does on JACCL, whose sends of changing sizes are
unsafe), forced on a TCP ring with RING_FRAMES: every message either way is one frame's size,
prompt chunks and decode steps span several frames, and every rank computes exactly what
single-process mlx-lm does."""

import json

import numpy as np
import pytest
from ringutil import ROOT, launch, make_tiny_model, reference_logits

DRIVER = str(ROOT / "tests" / "frames_driver.py")


@pytest.mark.parametrize(
    "mode", [["--layers", "2,3"], ["--parallel", "tensor"]], ids=["pipeline", "tensor"]
)
def test_framed_steps_match_mlx_lm_and_every_message_is_one_frame(tmp_path, mode):
    """In tensor mode a decode step on ids still being sampled sends its
    header alone (one frame)."""
    model = make_tiny_model(tmp_path / "model", "qwen3", n_layers=5)
    spec = [
        {"prompt": [5, 17, 42, 99, 3, 250, 7], "max_tokens": 6, "at": 0},
        # 3 chunks, beside decode steps
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
            *mode,
            "--out",
            str(tmp_path),
        ],
        env={"RING_FRAMES": "256"},
    )
    result = json.loads((tmp_path / "result.json").read_text())
    for i, s in enumerate(spec):
        want, want_tokens = reference_logits(model, s["prompt"], steps=s["max_tokens"])
        # Several chunks: float rounding of other shapes, as in test_fidelity; tensor mode
        # sums in another order.
        tol = 1e-5 if i == 0 and mode[0] == "--layers" else 1e-4
        np.testing.assert_allclose(
            np.load(tmp_path / f"logits{i}.npy"), want, rtol=tol, atol=tol, err_msg=f"sequence {i}"
        )
        assert result["tokens"][i] == want_tokens, f"sequence {i}"
    for r in range(2):
        seen = json.loads((tmp_path / f"frames{r}.json").read_text())
        # Besides MLX's own all_gathers at startup (not sends), one size only, whatever the
        # step; in tensor mode no step goes through MLX: they go on the control link from
        # rank 0 (the all_sums give everyone the output).
        tensor = mode[0] == "--parallel"
        want = {"sent": [] if tensor else [256], "received": [] if tensor else [256]}
        assert seen == {"frame": 256, **want}, seen
