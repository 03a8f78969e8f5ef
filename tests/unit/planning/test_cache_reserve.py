"""The plan's cache reserve follows each layer's kind of cache, as mlx-lm makes it: every token
in a full-attention layer, at most the window in a sliding-window layer, a fixed state in a
recurrent one, and latent attention's compressed vector instead of keys and values."""

from dataclasses import replace

import pytest

from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.cost import layer_kv_bytes, max_layers
from mlx_ring.planning.plan import ModelSpec
from mlx_ring.planning.sizes import spec_from_config

FULL = ModelSpec(62, 0.8e9, 2.8e9, 1.4e9, 16 * 128 * 2 * 2, 0.8e9, 1.6e9, 2.8e9, "bfloat16", "full")


def test_each_kind_reserves_its_own_share():
    per_token = FULL.kv_bytes_per_token
    assert layer_kv_bytes(FULL, 8192) == 8192 * per_token
    sliding = replace(FULL, kv_window_share=5 / 6, kv_window=1024)
    assert layer_kv_bytes(sliding, 8192) == pytest.approx((8192 / 6 + 1024 * 5 / 6) * per_token)
    # under the window: every token
    assert layer_kv_bytes(sliding, 512) == layer_kv_bytes(FULL, 512)
    hybrid = replace(FULL, state_share=0.75, state_bytes=3e6)
    assert layer_kv_bytes(hybrid, 8192) == pytest.approx(8192 / 4 * per_token + 0.75 * 3e6)
    mini = Capabilities("mini", 24, 16, 4, 120)
    # 16 GiB (no activations in this spec), 0.8 GB of weights a layer: + 268 MB of cache (full), +
    # 52 MB (sliding)
    assert (max_layers(FULL, mini, 1, 32768), max_layers(sliding, mini, 1, 32768)) == (16, 20)


def test_gemma3_27b_slides_five_layers_in_six():
    spec = spec_from_config(
        {
            "model_type": "gemma3",
            "vocab_size": 262208,
            "text_config": {
                "model_type": "gemma3_text",
                "hidden_size": 5376,
                "intermediate_size": 21504,
                "num_hidden_layers": 62,
                "num_attention_heads": 32,
                "num_key_value_heads": 16,
                "head_dim": 128,
                "sliding_window": 1024,
                "sliding_window_pattern": 6,
                "torch_dtype": "bfloat16",
            },
        }
    )
    assert spec.n_layers == 62 and spec.kv_window == 1024
    assert spec.kv_window_share == pytest.approx(52 / 62)  # layers 5, 11, ..., 59 are global
    assert spec.kv_bytes_per_token == 2 * 16 * 128 * 2


def test_gpt_oss_reads_its_layer_types():
    types = ["sliding_attention", "full_attention"] * 12
    spec = spec_from_config(
        {
            "model_type": "gpt_oss",
            "hidden_size": 2880,
            "intermediate_size": 2880,
            "num_hidden_layers": 24,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "num_local_experts": 32,
            "num_experts_per_tok": 4,
            "vocab_size": 201088,
            "sliding_window": 128,
            "layer_types": types,
        }
    )
    assert (spec.kv_window_share, spec.kv_window, spec.state_share) == (0.5, 128, 0.0)


def test_deepseek_v3_caches_its_latent_vector():
    spec = spec_from_config(
        {
            "model_type": "deepseek_v3",
            "hidden_size": 7168,
            "intermediate_size": 18432,
            "moe_intermediate_size": 2048,
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "n_routed_experts": 256,
            "n_shared_experts": 1,
            "num_experts_per_tok": 8,
            "kv_lora_rank": 512,
            "q_lora_rank": 1536,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "qk_nope_head_dim": 128,
            "first_k_dense_replace": 3,
            "n_group": 8,
            "topk_group": 4,
            "vocab_size": 129280,
            "torch_dtype": "bfloat16",
        }
    )
    # keys and values of 128 heads x 56 would be 28672
    assert spec.kv_bytes_per_token == (512 + 64) * 2
    assert spec.kv_window_share == spec.state_share == 0.0


def test_lfm2_keeps_a_convolution_state_in_its_conv_layers():
    types = ["conv", "conv", "full_attention"] * 5 + ["conv"]
    spec = spec_from_config(
        {
            "model_type": "lfm2",
            "hidden_size": 2048,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "max_position_embeddings": 128000,
            "norm_eps": 1e-5,
            "conv_bias": False,
            "conv_L_cache": 3,
            "block_dim": 2048,
            "block_ff_dim": 12288,
            "block_multiple_of": 256,
            "block_ffn_dim_multiplier": 1.0,
            "block_auto_adjust_ff_dim": True,
            "vocab_size": 65536,
            "layer_types": types,
            "torch_dtype": "bfloat16",
        }
    )
    assert spec.state_share == pytest.approx(11 / 16) and spec.state_bytes == 2 * 2048 * 2
    assert layer_kv_bytes(spec, 8192) == pytest.approx(
        8192 * 5 / 16 * spec.kv_bytes_per_token + 11 / 16 * 8192
    )


def test_an_unknown_type_reserves_for_every_token():
    spec = spec_from_config(
        {
            "model_type": "no_such_model",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "vocab_size": 320,
        }
    )
    assert (spec.kv_window_share, spec.state_share) == (0.0, 0.0)


DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "first_k_dense_replace": 3,
    "n_group": 8,
    "topk_group": 4,
    "vocab_size": 129280,
    "torch_dtype": "bfloat16",
}


def test_experts_shared_experts_and_latent_attention_come_from_mlx_lms_own_tensors():
    """DeepSeek-V3: 671B parameters, about 37B of them read per token (8 of 256 routed experts, the
    shared expert, latent attention), as published."""
    spec = spec_from_config(DEEPSEEK_V3)
    params = (spec.n_layers * spec.layer_bytes + spec.ends_bytes) / 2
    assert 665e9 < params < 675e9
    active = (spec.n_layers * spec.layer_read_bytes + spec.ends_bytes) / 2
    assert 36e9 < active < 40e9


def test_per_layer_quantization_entries_size_their_layers():
    """mlx-lm's mixed quantization: a per-layer entry overrides the default
    bits, `false` keeps float."""
    q4 = spec_from_config({**DEEPSEEK_V3, "quantization": {"group_size": 64, "bits": 4}})
    mixed = spec_from_config(
        {
            **DEEPSEEK_V3,
            "quantization": {
                "group_size": 64,
                "bits": 4,
                **{
                    f"model.layers.{i}.mlp.switch_mlp.{p}": {"group_size": 64, "bits": 8}
                    for i in range(3, 61)
                    for p in ("gate_proj", "up_proj", "down_proj")
                },
                "lm_head": False,
            },
        }
    )
    experts = 58 * 3 * 256 * 2048 * 7168  # routed expert weights of the 58 MoE layers
    assert mixed.n_layers * (mixed.layer_bytes - q4.layer_bytes) == pytest.approx(
        experts * 4 / 8, rel=1e-6
    )
    assert mixed.ends_bytes - q4.ends_bytes == pytest.approx(
        129280 * 7168 * (2 - 4 / 8 - 4 / 64), rel=1e-6
    )


def test_the_docs_hold_the_dry_run_plans_of_the_big_models():
    """docs/models.md's plan table is what the planner says now for the published configs (the tool
    that writes it, run as the docs say)."""
    import subprocess
    import sys

    from ringutil import ROOT

    table = subprocess.run(
        [sys.executable, "-m", "tools.model_plans"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert table.strip() and table.strip() in (ROOT / "docs" / "models.md").read_text()
