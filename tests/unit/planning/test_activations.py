"""The plan's runtime: activations estimated from the model's shape and the serving settings,
counted where they are more than the flat reserve. Pure: no MLX."""

from dataclasses import replace

import pytest

from mlx_ring.planning.activations import activation_bytes, holds_graph
from mlx_ring.planning.assemble import plan_for, serving
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.cost import max_layers, runtime_bytes
from mlx_ring.planning.plan import GIB
from mlx_ring.planning.report import format_summary, summary
from mlx_ring.planning.sizes import spec_from_config

# Llama-3-8B's shape, bfloat16, the default model's vocabulary (tools/random_model.py llama3-8b)
LLAMA_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 49152,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 8192,
}
H200 = Capabilities("gpu", 140, 120, 700, 4000, "NVIDIA H200")
CPU = Capabilities("box", 24, 10, 0.05, 2, "AMD EPYC")
MAC = Capabilities("mac", 64, 48, 30, 546, "Apple M4 Max", working_set_gb=48)


def test_a_cuda_stage_holds_a_chunks_activations_for_every_layer():
    """16 layers of the 8B shape with 512-token chunks took 1.34-1.44 GiB beyond weights and
    caches in a warm-up on an H200 (prompts up to a chunk long): the estimate for that is no
    less, nor far more."""
    spec = serving(spec_from_config(LLAMA_8B), 512, 64)
    assert spec.act_bytes_per_token > 0 and spec.heads == 32 and spec.vocab == 49152
    short = activation_bytes(spec, H200, 1, 16, 512, tokens=512)
    assert 1.44 * GIB <= short <= 1.25 * 1.44 * GIB
    # A chunk of a long prompt attends to more keys; twice the layers hold twice the arrays.
    assert activation_bytes(spec, H200, 1, 16, 4096, tokens=512) > short
    assert activation_bytes(spec, H200, 1, 32, 512, tokens=512) > 1.9 * short
    assert holds_graph(H200) and not holds_graph(CPU) and not holds_graph(MAC)


def test_elsewhere_one_layer_at_a_time_and_the_head_on_rank_0():
    spec = serving(spec_from_config(LLAMA_8B), 128, 16)
    one_layer = 128 * spec.act_bytes_per_token
    scores = 2 * 32 * 128 * 8192 * 4  # one layer's, unfused, in float32
    assert activation_bytes(spec, CPU, 1, 16, 8192) == pytest.approx(one_layer + scores)
    # Metal's attention is fused
    assert activation_bytes(spec, MAC, 1, 16, 8192) == pytest.approx(one_layer)
    # No prompt is longer than the model's context, however much KV cache the ring keeps room for.
    assert activation_bytes(spec, CPU, 1, 16, 10**6) == activation_bytes(spec, CPU, 1, 16, 8192)
    assert (
        spec_from_config(
            {k: v for k, v in LLAMA_8B.items() if k != "max_position_embeddings"}
        ).context_length
        == 4096
    )
    assert activation_bytes(spec, MAC, 0, 16, 8192) == pytest.approx(one_layer + 2 * 16 * 49152 * 4)
    # More rows decoding at once than a chunk has tokens: the rows count.
    many = serving(spec, 128, 1024)
    assert activation_bytes(many, MAC, 1, 16, 8192) == pytest.approx(
        1024 * spec.act_bytes_per_token
    )


def test_the_plan_counts_the_estimate_as_the_runtime():
    spec = serving(spec_from_config({**LLAMA_8B, "num_hidden_layers": 32}), 512, 64)
    plan, caps, _ = plan_for(spec, [H200, replace(H200, host="gpu2")], None, "uniform", 8192)
    s = summary(spec, caps, plan, 8192)
    for r, (c, (lo, hi)) in enumerate(zip(caps, plan.ranges)):
        assert (
            s["ranks"][r]["runtime_gb"]
            == round(activation_bytes(spec, c, r, hi - lo, 8192) / GIB, 3)
            > 0.5
        )
    assert "runtime" in format_summary(s).splitlines()[0]
    # A small model on a Mac: its own small estimate, no flat reserve.
    tiny = serving(
        spec_from_config(
            {
                **LLAMA_8B,
                "hidden_size": 256,
                "intermediate_size": 512,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
            }
        ),
        0,
        16,
    )
    assert (
        0
        < runtime_bytes(tiny, MAC, 0, 16, 8192)
        == activation_bytes(tiny, MAC, 0, 16, 8192)
        < 0.1 * GIB
    )
    # A rank that holds every layer's activations is given fewer layers than weights
    # and caches alone allow.
    small, lean = (
        replace(H200, usable_gb=8),
        replace(spec, act_bytes_per_token=0.0, heads=0, vocab=0),
    )
    assert 0 < max_layers(spec, small, 1, 8192) < max_layers(lean, small, 1, 8192)


def test_a_cuda_rank_prefills_steps_worth_its_memory_and_a_mac_one_chunk():
    """The prefill step a rank's plan counts (`step_tokens`): on a CUDA device, whole chunks of a
    quarter of what weights and the KV_TOKENS reserve leave, so a burst of long prompts goes
    several at a time; on a Mac or a CPU one chunk, whose time bounds a step there. The
    scheduler's step and budget (`prefill_step`) are the same figure the runtime counts."""
    from mlx_ring.planning.activations import CUDA_SHARE, prefill_step, step_tokens

    h100 = Capabilities("gpu", 79.2, 71.3, 700, 3000, "NVIDIA H100 80GB HBM3")
    spec = serving(spec_from_config({**LLAMA_8B, "num_hidden_layers": 16}), 0, 64)
    tokens = step_tokens(spec, h100, 0, 16, 8192)
    # 8 or more prompts' 512-token chunks a step
    assert tokens % 512 == 0 and 8 * 512 <= tokens <= 16384
    held = activation_bytes(spec, h100, 0, 16, 8192)
    assert held == activation_bytes(spec, h100, 0, 16, 8192, tokens=tokens)
    left = (
        h100.usable_gb * GIB
        - 16 * (spec.layer_bytes + 8192 * spec.kv_bytes_per_token)
        - spec.ends_bytes
    )
    assert (
        CUDA_SHARE * left - 512 * 16 * spec.act_bytes_per_token
        < held
        <= CUDA_SHARE * left + 2 * 64 * 49152 * 4
    )
    assert prefill_step(spec, [h100], [16], 8192, 512) == tokens
    # More layers leave less memory and hold more a token: smaller steps; a small
    # GPU keeps one chunk.
    assert step_tokens(spec, h100, 0, 32, 8192) < tokens
    assert step_tokens(spec, replace(h100, usable_gb=12), 0, 16, 8192) == 512
    # A Mac or a CPU: one chunk (or a decode step of MAX_ACTIVE rows), as before.
    for cap in (MAC, CPU):
        assert step_tokens(spec, cap, 0, 16, 8192) == 512
    # a Mac's watchdog chunk bounds the ring's steps
    assert prefill_step(spec, [h100, MAC], [8, 8], 8192, 256) == 256


def test_the_estimate_counts_unfused_scores_up_to_where_the_forward_fuses_them():
    from mlx_ring.models.compat import UNFUSED_PREFILL_KEYS
    from mlx_ring.planning.activations import UNFUSED_KEYS

    assert UNFUSED_KEYS == UNFUSED_PREFILL_KEYS
