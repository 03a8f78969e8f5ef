"""Ranks that would serve different things refuse to start, naming the host, instead of answering
garbage: here rank 1 of a local ring is given another model (as an ssh rank once was, by MODEL=
reaching rank 0 only)."""

import subprocess

from ringutil import ROOT, free_port, launch_cmd, make_tiny_model

# Every rank runs server.py; rank 1 sees a MODEL of its own.
PER_RANK_MODEL = (
    "import os, runpy, sys; script, models, rest = sys.argv[1], sys.argv[2:4], sys.argv[4:]; "
    "os.environ['MODEL'] = models[int(os.environ['MLX_RANK'])]; sys.argv = [script, *rest]; "
    "runpy.run_path(script, run_name='__main__')"
)


def test_ranks_with_different_models_refuse_to_start(tmp_path):
    a = make_tiny_model(tmp_path / "a", "llama", n_layers=4, seed=1)
    b = make_tiny_model(tmp_path / "b", "llama", n_layers=4, seed=2)  # same shapes, other weights
    argv = [
        "-c",
        PER_RANK_MODEL,
        str(ROOT / "server.py"),
        str(a),
        str(b),
        "--log-dir",
        str(tmp_path / "logs"),
        "--port",
        str(free_port()),
    ]
    p = subprocess.run(
        launch_cmd(2, tmp_path, argv), cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    out = p.stdout + p.stderr
    assert (
        "cannot start: rank 1 on host" in out and "has model" in out and "set MODEL once" in out
    ), out[-3000:]
    assert "ready:" not in out and "Traceback" not in out, out[-3000:]
