"""The sizes of model_zoo's tiny models: a small value for each field name mlx-lm's ModelArgs use,
whatever the type, and the layer count, vocabulary and window they are built around.
"""

LAYERS = 4  # enough for every kind of layer a pattern repeats (see PATTERNS); split 2,1,1 and 3,1
VOCAB = 256
WINDOW = 4  # sliding windows shorter than the prompts, so they slide

# A small value for each field name mlx-lm's ModelArgs use, whatever its default.
SMALL = {
    **dict.fromkeys(
        ["hidden_size", "d_model", "n_embd", "hidden_dim", "model_dim", "block_dim"], 64
    ),
    **dict.fromkeys(
        [
            "num_attention_heads",
            "n_head",
            "n_heads",
            "num_heads",
            "num_query_heads",
            "swa_num_attention_heads",
            "index_n_heads",
        ],
        4,
    ),
    **dict.fromkeys(
        [
            "num_key_value_heads",
            "num_kv_heads",
            "n_kv_heads",
            "swa_num_key_value_heads",
            "num_attention_groups",
            "multi_query_group_num",
        ],
        2,
    ),
    **dict.fromkeys(
        [
            "head_dim",
            "swa_head_dim",
            "v_head_dim",
            "swa_v_head_dim",
            "qk_nope_head_dim",
            "index_head_dim",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "mamba_head_dim",
            "attention_head_dim",
        ],
        16,
    ),
    **dict.fromkeys(
        [
            "intermediate_size",
            "ffn_hidden_size",
            "n_inner",
            "ff_intermediate_size",
            "block_ff_dim",
            "intermediate_size_mlp",
            "dense_intermediate_size",
        ],
        128,
    ),
    **dict.fromkeys(
        [
            "moe_intermediate_size",
            "expert_ffn_hidden_size",
            "shared_expert_intermediate_size",
            "shared_intermediate_size",
            "expert_intermediate_size",
        ],
        32,
    ),
    **dict.fromkeys(["num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"], 4),
    **dict.fromkeys(["num_experts_per_tok", "moe_topk", "moe_k", "top_k"], 2),
    **dict.fromkeys(
        ["n_shared_experts", "num_shared_experts", "num_shared_expert", "moe_num_shared_experts"], 1
    ),
    **dict.fromkeys(
        ["num_hidden_layers", "num_layers", "n_layer", "n_layers", "num_transformer_layers"], LAYERS
    ),
    **dict.fromkeys(["vocab_size", "padded_vocab_size"], VOCAB),
    **dict.fromkeys(
        [
            "max_position_embeddings",
            "n_positions",
            "n_ctx",
            "block_size",
            "model_max_length",
            "seq_length",
        ],
        512,
    ),
    **dict.fromkeys(
        [
            "sliding_window",
            "sliding_window_size",
            "attention_window_size",
            "attention_chunk_size",
            "sliding_window_sizes",
        ],
        WINDOW,
    ),
    "kv_lora_rank": 32,
    "q_lora_rank": 48,
    "qk_rope_head_dim": 8,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "num_dense_layers": 1,
    "routed_scaling_factor": 1.5,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_conv_kernel_dim": 4,
    "state_size": 8,
    "ssm_state_size": 8,
    "mamba_d_state": 8,
    "mamba_num_heads": 8,
    "time_step_rank": 8,
    "n_groups": 1,
    "mamba_n_groups": 1,
    "conv_kernel": 4,
    "mamba_d_conv": 4,
    "conv_L_cache": 3,
    "conv1d_width": 4,
    "a_low_rank_dim": 8,
    "v_low_rank_dim": 8,
    "gate_low_rank_dim": 8,
    "decay_low_rank_dim": 8,
    "index_topk": 4,
    "dim_model_base": 64,
    "moe_top_k": 2,
    "share_expert_dim": 32,
    "sliding_window_pattern": 2,
    "vocab_size_per_layer_input": VOCAB,
    "global_head_dim": 32,
    "num_kv_shared_layers": 0,
    "hidden_size_per_layer_input": 0,
    "ffn_dim_divisor": 16,
    "num_experts_per_token": 2,
    "routed_expert_hidden_size": 32,
}
# the usual `layer_types` of sliding-window models
SWA = ["sliding_attention", "full_attention"] * (LAYERS // 2)
YARN = {
    "type": "yarn",
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "rope_theta": 10000.0,
}
FLOATS = {
    "rms_norm_eps": 1e-5,
    "norm_eps": 1e-5,
    "layer_norm_eps": 1e-5,
    "layer_norm_epsilon": 1e-5,
    "layernorm_epsilon": 1e-5,
    "rope_theta": 10000.0,
}
