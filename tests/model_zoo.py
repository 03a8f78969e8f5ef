"""A tiny random model of every text-decoder type mlx-lm ships, its config derived from the type's
own `ModelArgs`: every field mlx-lm declares gets a small value of its kind (widths, heads, experts,
latent ranks, windows, state sizes), so experts, latent attention, sliding windows and recurrent or
convolution states are kept, only small. Types that mlx-lm runs under another's code
(`MODEL_REMAPPING`: `kimi_k2` as `deepseek_v3`, ...) are types of their own here, as users name
them.

    python tests/model_zoo.py list                 # every type and the config it gets
    python tests/model_zoo.py make TYPE FOLDER [--bits 4]

The supported-model list (mlx_ring/models/supported.json) is what tests/ring/test_model_matrix.py
finds when these models run split across ranks; see docs/models.md.
"""

import argparse
import dataclasses
import importlib
import json
import pkgutil
from pathlib import Path

import mlx.core as mx
import mlx_lm.models
from mlx.utils import tree_flatten
from mlx_lm.utils import MODEL_REMAPPING, quantize_model

from mlx_ring.models.compat import model_classes

# Modules of mlx_lm.models that are parts of models, not model types.
NOT_TYPES = {
    "activations",
    "base",
    "bitlinear_layers",
    "cache",
    "gated_delta",
    "mla",
    "pipeline",
    "rope_utils",
    "ssm",
    "switch_layers",
}
LAYERS = 4  # enough for every kind of layer a pattern repeats (see PATTERNS); split 2,1,1 and 3,1
VOCAB = 256
MAX_PARAMETERS = 3_000_000
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

# Per type: what a field name alone does not say (layer patterns of LAYERS entries, consistent
# pairs).
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


def text_decoder_types() -> list[str]:
    """Every model type mlx-lm 0.32 loads: its model modules, and the names it remaps to one of
    them."""
    mods = sorted(
        m.name for m in pkgutil.iter_modules(mlx_lm.models.__path__) if m.name not in NOT_TYPES
    )
    return sorted(set(mods) | {k for k, v in MODEL_REMAPPING.items() if v in mods})


def _args_class(kind: str):
    try:
        return model_classes({"model_type": kind})[1]
    # a module that needs a package we do not install (olmo: ai2-olmo)
    except (ValueError, SystemExit) as e:
        raise ValueError(f"mlx-lm cannot import its {kind} module ({e})") from None


def _fill(args_cls, kind: str) -> dict:
    config = {}
    for f in dataclasses.fields(args_cls):
        if f.name in SMALL:
            config[f.name] = SMALL[f.name]
        elif f.name in FLOATS:
            config[f.name] = FLOATS[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            config[f.name] = SWA if f.name == "layer_types" else _required_default(f)
    config["model_type"] = kind
    return config


def _required_default(f) -> object:
    t = str(f.type).lower()
    if "list" in t:
        return []
    if "dict" in t:
        return {}
    if "bool" in t:
        return False
    if "float" in t:
        return 1.0
    if "int" in t:
        return 1
    return None


def tiny_config(kind: str) -> dict:
    """The config of `kind`'s tiny model: small values for every field of its ModelArgs, then its
    overrides."""
    args_cls = _args_class(kind)
    text_cls = next(
        (
            getattr(importlib.import_module(args_cls.__module__), n)
            for n in TEXT_CLASSES
            if hasattr(importlib.import_module(args_cls.__module__), n)
        ),
        None,
    )
    if kind in WRAPS:
        text = tiny_config(WRAPS[kind])
        config = {
            "model_type": kind,
            "vocab_size": VOCAB,
            "text_config": text.get("text_config", text),
        }
    elif text_cls is not None and any(
        f.name == "text_config" for f in dataclasses.fields(args_cls)
    ):
        config = {"model_type": kind, "vocab_size": VOCAB, "text_config": _fill(text_cls, kind)}
    else:
        config = _fill(args_cls, kind)
    return _merge(config, OVERRIDES.get(kind, {}))


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def build(config: dict, seed: int = 0):
    """The model mlx-lm builds for `config`, with random weights that every one matters (norms and
    biases perturbed too), seeded for repeatability."""
    model_cls, args_cls = model_classes(config)
    mx.random.seed(seed)
    # lazy: nothing is allocated before the size check
    model = model_cls(args_cls.from_dict(config))
    sizes = sorted(((v.size, k) for k, v in tree_flatten(model.parameters())), reverse=True)
    if sum(n for n, _ in sizes) > MAX_PARAMETERS:
        raise ValueError(
            f"{config['model_type']}: the tiny config is not tiny ({sum(n for n, _ in sizes)} "
            f"parameters, the largest {sizes[:3]}); give the field that sizes it a small value "
            "in SMALL or OVERRIDES"
        )
    params = [
        (k, v + 0.02 * mx.random.normal(v.shape).astype(v.dtype))
        for k, v in tree_flatten(model.parameters())
    ]
    model.load_weights(params)
    mx.eval(model.parameters())
    return model


def make(
    kind: str, folder: Path, bits: int = 0, changes: dict | None = None, seed: int = 0
) -> Path:
    """Write `kind`'s tiny model to `folder` (config.json and model.safetensors; no tokenizer:
    tests feed token ids); `bits` 4 or 8: quantized as `mlx_lm.convert` quantizes (groups of 32);
    `changes`: merged into its config (a variant: other sizes, another layer count), `seed`:
    other weights."""
    config = _merge(tiny_config(kind), changes or {})
    model = build(config, seed)
    if bits:
        model, config = quantize_model(model, config, group_size=32, bits=bits)
    # The layer count where the ring's plan reads it, whatever the type names it (n_layers,
    # text_config, ...).
    config.setdefault("num_hidden_layers", len(model.layers))
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    m = sub.add_parser("make")
    m.add_argument("kind")
    m.add_argument("out", type=Path)
    m.add_argument("--bits", type=int, default=0)
    a = p.parse_args()
    if a.cmd == "list":
        for kind in text_decoder_types():
            try:
                print(kind, json.dumps(tiny_config(kind)))
            except ValueError as e:
                print(kind, f"-- {e}")
    else:
        print(make(a.kind, a.out, a.bits))


if __name__ == "__main__":
    main()
