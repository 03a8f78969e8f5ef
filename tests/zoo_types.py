"""What model_zoo needs per model type beyond the field names: each type's overrides (layer
patterns, consistent pairs), and the text model inside each vision-language wrapper.
"""

from zoo_fields import LAYERS, SWA, VOCAB, WINDOW, YARN

# Per type: what a field name alone does not say (layer patterns of LAYERS
# entries, consistent pairs).
OVERRIDES: dict[str, dict] = {
    "afmoe": {"layer_types": SWA},
    "gear": {"layer_types": SWA},
    "exaone_moe": {"layer_types": SWA, "is_moe_layer": [False, True, True, True]},
    "spark2_5": {
        "layer_types": SWA,
        "rope_parameters": {
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
            "full_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    },
    "step3p5": {"layer_types": SWA, "moe_num_experts": 4},
    "granitemoehybrid": {
        "layer_types": ["mamba", "attention", "mamba", "attention"],
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_d_state": 8,
        "mamba_n_groups": 1,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
    },
    "lfm2": {
        "layer_types": ["conv", "full_attention", "conv", "full_attention"],
        "block_ff_dim": 128,
    },
    "lfm2_moe": {"layer_types": ["conv", "full_attention", "conv", "full_attention"]},
    "llama4_text": {
        "no_rope_layers": [1, 1, 1, 0],
        "interleave_moe_layer_step": 2,
        "attention_chunk_size": WINDOW,
    },
    "llama4": {
        "text_config": {
            "no_rope_layers": [1, 1, 1, 0],
            "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 2,
            "attention_chunk_size": WINDOW,
            "rope_scaling": None,
        }
    },
    "gemma3_text": {"sliding_window_pattern": 2},
    "exaone4": {"sliding_window_pattern": "LG"},
    "jamba": {
        "attn_layer_period": 2,
        "attn_layer_offset": 1,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "mamba_expand": 2,
        "mamba_dt_rank": 8,
    },
    "kimi_linear": {
        "linear_attn_config": {
            "kda_layers": [1, 2, 3],
            "full_attn_layers": [4],
            "num_heads": 4,
            "head_dim": 16,
            "short_conv_kernel_size": 4,
        },
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
    },
    "kimi_k3": {
        "text_config": {
            "linear_attn_config": {
                "kda_layers": [1, 2, 3],
                "full_attn_layers": [4],
                "num_heads": 4,
                "head_dim": 16,
                "short_conv_kernel_size": 4,
            },
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16,
            "v_head_dim": 16,
        }
    },
    # each rank of both splits keeps a cache
    "nemotron_h": {"hybrid_override_pattern": ["M", "-", "*", "M"]},
    "nemotron-nas": {
        "block_configs": [
            {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 1.0}},
            {"attention": {"n_heads_in_group": 4}, "ffn": {"replace_with_linear": True}},
            {"attention": {"no_op": True}, "ffn": {"ffn_mult": 1.0}},
            {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 1.0}},
        ]
    },
    "recurrent_gemma": {"block_types": ["recurrent", "recurrent", "attention"], "lru_width": 64},
    "openelm": {
        "num_query_heads": [4] * LAYERS,
        "num_kv_heads": [2] * LAYERS,
        "ffn_multipliers": [1.0] * LAYERS,
    },
    "mamba2": {"time_step_limit": [0.0, float("inf")], "num_heads": 8, "head_dim": 16},
    "hunyuan": {"rope_scaling": {"alpha": 1.0, "factor": 1.0, "type": "dynamic"}},
    "deepseek_v2": {"rope_scaling": YARN},
    "minicpm3": {
        "rope_scaling": {
            "type": "longrope",
            "long_factor": [1.0] * 4,
            "short_factor": [1.0] * 4,
            "original_max_position_embeddings": 512,
        }
    },
    "ministral3": {"rope_parameters": dict(YARN, llama_4_scaling_beta=0.1)},
    "mistral4": {"rope_parameters": dict(YARN, llama_4_scaling_beta=0.1)},
    "mellum": {
        "layer_types": SWA,
        "rope_parameters": {
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
            "full_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    },
    "gemma3n": {
        "text_config": {
            "activation_sparsity_pattern": [0.0] * LAYERS,
            "hidden_size_per_layer_input": 16,
            "altup_num_inputs": 2,
            "altup_coef_clip": 120.0,
            "altup_correct_scale": True,
            "laurel_rank": 8,
            "rope_local_base_freq": 10000.0,
            "final_logit_softcapping": 30.0,
        }
    },
    "baichuan_m1": {"conv_window": 2, "sliding_window_layers": [0, 2]},
    "muse_spark": {
        "text_config": {
            "num_shared_experts": 0,
            "mlp_layer_types": ["sparse"] * LAYERS,
            "layer_rope_theta": [10000.0] * LAYERS,
            "moe_hidden_size": 16,
            "post_norm_eps": 1e-5,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        }
    },
    "qwen3_5_moe": {
        "text_config": {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
        }
    },
    "mimo_v2_flash": {
        "hybrid_layer_pattern": [1, 0, 1, 0],
        "moe_layer_freq": [0, 1, 1, 1],
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
    },
    "glm_moe_dsa": {
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "moe_layer_freq": 1,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    },
    "gptj": {"rotary_dim": 8},
    "minimax": {"rotary_dim": 8},
    "minimax_m2": {"rotary_dim": 8},
    "plamo": {"n_shared_head": 2},
    "qwen": {"intermediate_size": 256, "kv_channels": 16},  # its MLP halves the intermediate size
    "dbrx": {
        "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2},
        "attn_config": {"kv_n_heads": 2, "clip_qkv": 8, "rope_theta": 10000.0},
    },
    "longcat_flash": {
        "mla_scale_q_lora": True,
        "mla_scale_kv_lora": True,
        "zero_expert_type": "identity",
    },
    "longcat_flash_ngram": {
        "mla_scale_q_lora": True,
        "mla_scale_kv_lora": True,
        "zero_expert_type": "identity",
    },
    # linear attention, then full, twice (1 makes every layer full)
    "bailing_moe_linear": {"layer_group_size": 2},
    "phixtral": {
        "num_vocab": VOCAB,
        "model_dim": 64,
        "num_heads": 4,
        "num_layers": LAYERS,
        "rotary_dim": 8,
        "num_experts_per_tok": 2,
        "num_local_experts": 4,
    },
    "phi-msft": {
        "num_vocab": VOCAB,
        "model_dim": 64,
        "num_heads": 4,
        "num_layers": LAYERS,
        "rotary_dim": 8,
        "num_experts_per_tok": 2,
        "num_local_experts": 4,
    },
}

# Vision-language wrappers: the text model's type, whose config goes into `text_config`.
WRAPS = {
    "gemma3": "gemma3_text",
    "gemma4": "gemma4_text",
    "gemma4_unified": "gemma4_text",
    "mistral3": "ministral3",
    "llava": "ministral3",
    "pixtral": "llama",
    "qwen2_vl": "qwen2",
    "qwen2_5_vl": "qwen2",
    "qwen3_vl": "qwen3",
    "qwen3_vl_moe": "qwen3_moe",
    "lfm2-vl": "lfm2",
    "kimi_k25": "deepseek_v3",
    "kimi_vl": "deepseek_v3",
    "prism_hadamard_qwen35": "qwen3_5",
    "qwen3_5_moe": "qwen3_5",
}
# ... or their own text arguments' class, by the names mlx-lm gives it.
TEXT_CLASSES = ("TextArgs", "TextConfig", "TextModelArgs")
