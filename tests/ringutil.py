"""Helpers for tests: real multi-rank runs through `mlx.launch`, free ports, tiny random models."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from bench import under_feed

ROOT = Path(__file__).resolve().parent.parent
MLX_LAUNCH = Path(sys.executable).parent / "mlx.launch"


def free_port(span: int = 1) -> int:
    """A port p such that p .. p+span-1 were all free a moment ago."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + span < 65000 and all(_is_free(p + i) for i in range(1, span)):
            return p
    raise RuntimeError("no free port range")


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def write_hostfile(path: Path, n: int) -> Path:
    path.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * n))
    return path


def launch_cmd(n: int, tmp: Path, argv: list[str]) -> list[str]:
    hostfile = write_hostfile(tmp / f"hosts{n}.json", n)
    cmd = [str(MLX_LAUNCH), "--backend", "ring", "--hostfile", str(hostfile),
           "--starting-port", str(free_port(n + 1)), "--", sys.executable, *argv]
    return under_feed(cmd)  # mlx.launch busy-loops on an idle stdin, see bench.py


def launch(n: int, tmp: Path, argv: list[str], timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python argv...` on n local ranks under mlx.launch; fail the test with its output on error."""
    proc = subprocess.run(launch_cmd(n, tmp, argv), cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"mlx.launch exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    return proc


TINY = {
    "llama": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 320, "rope_theta": 10000.0,
              "tie_word_embeddings": False},
    "qwen2": {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": 320, "rope_theta": 1e6,
              "tie_word_embeddings": True},
    "qwen3": {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6, "vocab_size": 320,
              "rope_theta": 1e6, "max_position_embeddings": 512, "tie_word_embeddings": False},
}


def make_tiny_model(folder: Path, kind: str, n_layers: int = 7, seed: int = 0) -> Path:
    """A random-weight MLX model folder of a real mlx_lm architecture (no tokenizer: tests feed ids)."""
    from mlx_lm.utils import _get_classes

    config = dict(TINY[kind], num_hidden_layers=n_layers)
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    # Random init leaves norms at 1 and biases at 0; perturb everything so every weight matters.
    params = {k: v + 0.02 * mx.random.normal(v.shape) for k, v in tree_flatten(model.parameters())}
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), params)
    (folder / "config.json").write_text(json.dumps(config))
    return folder
