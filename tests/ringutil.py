"""Helpers for tests: real multi-rank runs through `mlx.launch`, free ports, tiny random models."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from mlx_ring.models.compat import model_classes
from mlx_ring.ring.launch import free_port, under_feed

ROOT = Path(__file__).resolve().parent.parent
MLX_LAUNCH = Path(sys.executable).parent / "mlx.launch"


def write_hostfile(path: Path, n: int) -> Path:
    path.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * n))
    return path


def launch_cmd(n: int, tmp: Path, argv: list[str]) -> list[str]:
    hostfile = write_hostfile(tmp / f"hosts{n}.json", n)
    cmd = [
        str(MLX_LAUNCH),
        "--backend",
        "ring",
        "--hostfile",
        str(hostfile),
        "--starting-port",
        str(free_port(n + 1)),
        "--",
        sys.executable,
        *argv,
    ]
    return under_feed(cmd)  # mlx.launch busy-loops on an idle stdin


def launch(
    n: int, tmp: Path, argv: list[str], timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `python argv...` on n local ranks under mlx.launch; fail the test with
    its output on error."""
    proc = subprocess.Popen(
        launch_cmd(n, tmp, argv),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # Every rank too: one left behind holds the pipes open, and the test would
        # wait for it forever.
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            (
                f"ranks still running after {timeout} s\n--- stdout\n{out[-4000:]}\n--- "
                f"stderr\n{err[-6000:]}"
            )
        )
    proc = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    # mlx.launch exits 0 even when a rank fails: its warning says so.
    failed = (
        proc.returncode != 0 or "exited with code" in proc.stderr or "was killed" in proc.stderr
    )
    assert not failed, (
        f"mlx.launch exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- "
        f"stderr\n{proc.stderr[-6000:]}"
    )
    return proc


TINY = {
    "llama": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": 320,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    "qwen2": {
        "model_type": "qwen2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "vocab_size": 320,
        "rope_theta": 1e6,
        "tie_word_embeddings": True,
    },
    "qwen3": {
        "model_type": "qwen3",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "vocab_size": 320,
        "rope_theta": 1e6,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    },
    "mistral": {
        "model_type": "mistral",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-5,
        "vocab_size": 320,
        "rope_theta": 1e6,
        "tie_word_embeddings": False,
        "sliding_window": None,
    },
    "phi3": {
        "model_type": "phi3",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": 320,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.75,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    },
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [0],
        "moe_intermediate_size": 64,
        "rms_norm_eps": 1e-6,
        "vocab_size": 320,
        "rope_theta": 1e6,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        "norm_topk_prob": True,
    },
    "gemma2": {
        "model_type": "gemma2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "vocab_size": 320,
        "query_pre_attn_scalar": 16,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 3.0,
    },
    # Sliding layers of a 5-token window, every third layer global: prompts outgrow the window.
    "gemma3_text": {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "vocab_size": 320,
        "query_pre_attn_scalar": 16,
        "sliding_window": 5,
        "sliding_window_pattern": 3,
    },
    # Gemma 3 as released from 4B up: the text model inside a vision-language
    # wrapper (images not served).
    "gemma3": {
        "model_type": "gemma3",
        "vocab_size": 320,
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "rms_norm_eps": 1e-6,
            "query_pre_attn_scalar": 16,
            "sliding_window": 5,
            "sliding_window_pattern": 3,
            "num_hidden_layers": 7,
        },
    },
    "gpt_oss": {
        "model_type": "gpt_oss",
        "hidden_size": 64,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": 320,
        "sliding_window": 5,
        "rope_theta": 150000,
        "layer_types": ["sliding_attention", "full_attention"] * 3 + ["sliding_attention"],
    },
    "glm4": {
        "model_type": "glm4",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "attention_bias": True,
        "rms_norm_eps": 1e-5,
        "vocab_size": 320,
        "partial_rotary_factor": 0.5,
        "rope_theta": 10000.0,
    },
    # Multi-head latent attention (a compressed KV cache), a dense first layer, then routed experts.
    "deepseek_v3": {
        "model_type": "deepseek_v3",
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_shared_experts": 1,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "kv_lora_rank": 32,
        "q_lora_rank": 48,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "qk_nope_head_dim": 16,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "vocab_size": 320,
        "rms_norm_eps": 1e-6,
    },
    # Short convolutions (an ArraysCache of fixed state) between attention layers.
    "lfm2": {
        "model_type": "lfm2",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_dim": 64,
        "block_multiple_of": 16,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False,
        "block_ff_dim": 128,
        "vocab_size": 320,
        "layer_types": ["conv", "full_attention", "conv", "conv", "full_attention", "conv", "conv"],
    },
}


def make_tiny_model(
    folder: Path, kind: str, n_layers: int = 7, seed: int = 0, bits: int = 0, **overrides
) -> Path:
    """A random-weight MLX model folder of a real mlx_lm architecture (no tokenizer: tests feed
    ids); `bits` 4 or 8: quantized as mlx-lm quantizes (groups of 64); `overrides`: config keys."""
    config = dict(TINY[kind], num_hidden_layers=n_layers, **overrides)
    model_cls, args_cls = model_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    # Random init leaves norms at 1 and biases at 0; perturb everything so every weight matters.
    params = {k: v + 0.02 * mx.random.normal(v.shape) for k, v in tree_flatten(model.parameters())}
    if bits:
        model.load_weights(list(params.items()))
        nn.quantize(model, group_size=64, bits=bits)
        params = dict(tree_flatten(model.parameters()))
        config["quantization"] = {"group_size": 64, "bits": bits}
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), params)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def reference_logits(model_path, prompt, steps):
    """Single-process mlx_lm: the whole model, its own cache, greedy steps."""
    model, _ = load_model(model_path)
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[0, -1]
    rows, tokens = [], []
    for _ in range(steps):
        rows.append(np.array(logits.astype(mx.float32)))
        tokens.append(int(mx.argmax(logits).item()))
        logits = model(mx.array([[tokens[-1]]]), cache=cache)[0, -1]
    return np.stack(rows), tokens


def tool_model(folder: Path, model: Path) -> Path:
    """`model`'s weights and tokenizer (linked) under a chat template that offers tools in the
    Qwen2.5 way (`<tool_call>` JSON: mlx-lm's json_tools parser)."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in Path(model).iterdir():
        if f.name != "chat_template.jinja":
            (folder / f.name).symlink_to(f.resolve())
    (folder / "chat_template.jinja").write_text(
        (ROOT / "tests" / "data" / "tools_chat_template.jinja").read_text()
    )
    return folder


def mlx_lm_answer(model_path: Path, tokenizer, prompt: list[int], max_tokens: int) -> list[int]:
    """Single-process mlx-lm's greedy tokens for `prompt`, up to its end token (not included)."""
    from mlx_lm.generate import generate_step

    model, _ = load_model(Path(model_path))
    out = []
    for tok, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        if tok in tokenizer.eos_token_ids:
            break
        out.append(tok)
    return out


def wait_healthy(url: str, within: float, log: Path) -> float:
    """Seconds until `url`/health answers 200; the test fails with the end of `log` otherwise."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < within:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(
        f"not healthy within {within} s:\n{log.read_text()[-4000:] if log.exists() else ''}"
    )
