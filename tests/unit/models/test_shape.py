"""models/shape.py: one reading of a config.json's shape, as mlx-lm reads it, for the planner, the
tensor cutter and /api/show; each field pinned on the published configs (tests/data/configs) and
on small ones where the planner and the cutter used to read one file two ways."""

import json
from dataclasses import astuple, fields

import pytest
from ringutil import ROOT

from mlx_ring.api.ollama_routes import model_info
from mlx_ring.api.served import ServedModel
from mlx_ring.models.shape import ModelShape, read_shape, text_keys
from mlx_ring.planning.sizes import parameter_count
from mlx_ring.tensor.shares import tensor_shares

CONFIGS = ROOT / "tests" / "data" / "configs"
BF16 = "bfloat16"
# ModelShape's fields after model_type, in order.
NAMES = [
    "hidden_size",
    "layers",
    "heads",
    "kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "tied",
    "experts",
    "experts_per_token",
    "expert_width",
    "shared_experts",
    "shared_expert_width",
    "kv_lora_rank",
    "rope_head_dim",
    "attention_bias",
    "context_length",
    "dtype",
]
PUBLISHED = {  # hidden, layers, heads, KV, head_dim, width, vocab, tied; then experts ... dtype
    "deepseek-v3": (
        7168,
        61,
        128,
        128,
        56,
        18432,
        129280,
        False,
        256,
        8,
        2048,
        1,
        0,
        512,
        64,
        False,
        163840,
        BF16,
    ),
    "glm-4.6": (
        5120,
        92,
        96,
        8,
        128,
        12288,
        151552,
        False,
        160,
        8,
        1536,
        1,
        0,
        0,
        0,
        True,
        202752,
        BF16,
    ),
    "kimi-k2": (
        7168,
        61,
        64,
        64,
        112,
        18432,
        163840,
        False,
        384,
        8,
        2048,
        1,
        0,
        512,
        64,
        False,
        131072,
        BF16,
    ),
    "llama-4-scout": (
        5120,
        48,
        40,
        8,
        128,
        8192,
        202048,
        False,
        16,
        1,
        0,
        0,
        0,
        0,
        0,
        False,
        10485760,
        BF16,
    ),
    "minimax-m2": (
        3072,
        62,
        48,
        8,
        128,
        1536,
        200064,
        False,
        256,
        8,
        0,
        0,
        0,
        0,
        0,
        False,
        196608,
        BF16,
    ),
    "mixtral-8x22b": (
        6144,
        56,
        48,
        8,
        128,
        16384,
        32768,
        False,
        8,
        2,
        0,
        0,
        0,
        0,
        0,
        False,
        65536,
        BF16,
    ),
    "qwen3-235b-a22b": (
        4096,
        94,
        64,
        4,
        128,
        12288,
        151936,
        False,
        128,
        8,
        1536,
        0,
        0,
        0,
        0,
        False,
        40960,
        BF16,
    ),
    "qwen3-next-80b-a3b": (
        2048,
        48,
        16,
        2,
        256,
        5120,
        151936,
        False,
        512,
        10,
        512,
        0,
        512,
        0,
        0,
        False,
        262144,
        BF16,
    ),
}
# A small llama-style config that names no tie_word_embeddings.
DENSE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 1024,
}


def test_the_published_configs_read_as_pinned():
    assert [f.name for f in fields(ModelShape)] == ["model_type", *NAMES]
    assert sorted(p.stem for p in CONFIGS.glob("*.json")) == sorted(PUBLISHED)
    for name, want in PUBLISHED.items():
        config = json.loads((CONFIGS / f"{name}.json").read_text())
        shape = read_shape(config)
        assert shape.model_type == config["model_type"]
        assert dict(zip(NAMES, astuple(shape)[1:])) == dict(zip(NAMES, want)), name


@pytest.mark.parametrize(
    "kind,tied", [("llama", True), ("qwen2", True), ("mixtral", False), ("phi3", False)]
)
def test_a_missing_tie_word_embeddings_is_what_mlx_lm_does_for_the_type(kind, tied):
    """The planner counted a missing key as untied and the cutter as tied; mlx-lm's default is the
    type's own (llama's and qwen2's True, mixtral's and phi3's False)."""
    config = {**DENSE, "model_type": kind}
    if kind == "mixtral":
        config |= {"num_local_experts": 4, "num_experts_per_tok": 2}
    assert read_shape(config).tied is tied
    assert read_shape({**config, "tie_word_embeddings": not tied}).tied is not tied


def test_the_planner_and_the_cutter_count_a_missing_tie_alike():
    """Both count the head as mlx-lm builds it: a llama config without the key counts as tied, in
    the planner's parameters and in each rank's share of the weights."""
    config = {**DENSE, "model_type": "llama"}
    tied, untied = {**config, "tie_word_embeddings": True}, {**config, "tie_word_embeddings": False}
    assert parameter_count(config) == parameter_count(tied) == parameter_count(untied) - 256 * 64
    assert tensor_shares(config, 2) == tensor_shares(tied, 2) != tensor_shares(untied, 2)


def test_types_that_ignore_the_key_read_as_mlx_lm_builds_them():
    # DeepSeek-V3 and Qwen2-MoE always have a head of their own, pixtral forces one, Gemma has none.
    assert not read_shape({**DENSE, "model_type": "deepseek_v3", "tie_word_embeddings": True}).tied
    moe = {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
    }
    moe |= {"model_type": "qwen2_moe", "tie_word_embeddings": True}
    assert not read_shape({**DENSE, **moe}).tied
    text = {**DENSE, "model_type": "llama", "tie_word_embeddings": True}
    assert not read_shape({"model_type": "pixtral", "text_config": text}).tied
    gemma = {**DENSE, "model_type": "gemma", "head_dim": 16, "tie_word_embeddings": False}
    assert read_shape(gemma).tied


def test_a_type_mlx_lm_cannot_build_takes_the_configs_word_else_an_untied_head():
    config = {**DENSE, "model_type": "no_such_type"}
    assert not read_shape(config).tied  # a head of its own: the larger count, a plan never short
    assert read_shape({**config, "tie_word_embeddings": True}).tied
    shape = read_shape({k: v for k, v in config.items() if k != "num_key_value_heads"})
    assert (shape.kv_heads, shape.head_dim, shape.experts_per_token) == (4, 16, 1)


def test_text_config_comes_before_the_top_level_which_fills_what_it_lacks():
    """The planner took a wrapper's top level first and the cutter its text_config; mlx-lm builds
    the text model from text_config."""
    text = {
        **DENSE,
        "model_type": "qwen3",
        "head_dim": 16,
        "rope_theta": 1e6,
        "tie_word_embeddings": True,
    }
    wrapped = {"model_type": "qwen3_vl", "hidden_size": 999, "vocab_size": 100, "text_config": text}
    shape = read_shape(wrapped)
    assert (shape.model_type, shape.hidden_size, shape.vocab_size) == ("qwen3_vl", 64, 256)
    # mlx-lm cannot build it without a vocabulary: the keys, the top level filling in
    no_vocab = {**wrapped, "text_config": {k: v for k, v in text.items() if k != "vocab_size"}}
    assert read_shape(no_vocab).vocab_size == 100
    keys = text_keys(wrapped)
    assert (keys["hidden_size"], keys["vocab_size"], keys["model_type"]) == (64, 256, "qwen3_vl")


def test_mlx_lms_defaults_fill_what_a_wrapper_leaves_out():
    """Gemma 3's published configs leave out what equals the defaults: mlx-lm's wrapper fills in 8
    heads over 4 KV heads and the vocabulary, its text model a head_dim of 256; the context is
    text_config's. /api/show tells the same."""
    text = {
        "model_type": "gemma3_text",
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_hidden_layers": 34,
        "max_position_embeddings": 131072,
    }
    config = {"model_type": "gemma3", "text_config": text}
    shape = read_shape(config)
    assert (shape.heads, shape.kv_heads, shape.head_dim, shape.vocab_size) == (8, 4, 256, 262208)
    assert (shape.layers, shape.context_length) == (34, 131072)
    served = ServedModel(
        id="g",
        tokenizer=None,
        context_length=shape.context_length,
        default_max_tokens=1,
        vocab_size=1,
        config=config,
        shape=shape,
    )
    info = model_info(served)
    assert [
        info[f"gemma3.{k}"]
        for k in (
            "attention.head_count",
            "attention.head_count_kv",
            "block_count",
            "embedding_length",
            "vocab_size",
        )
    ] == [8, 4, 34, 2560, 262208]


def test_every_name_of_the_expert_counts_is_read():
    """The planner read three names of the expert count and one of the experts a token reads, the
    cutter four and none; both read all of them now."""
    dense = {**DENSE, "model_type": "no_such_type"}
    moe = {**dense, "moe_intermediate_size": 32}
    for key in ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"):
        assert read_shape({**moe, key: 4}).experts == 4, key
    for key in ("num_experts_per_tok", "moe_topk", "moe_k"):
        assert read_shape({**moe, "moe_num_experts": 4, key: 2}).experts_per_token == 2, key
    assert parameter_count({**moe, "moe_num_experts": 4}) > parameter_count(dense)


def test_latent_attention_has_a_kv_head_for_every_query_head():
    # deepseek_v3's arguments default num_key_value_heads to 32, which its attention never reads
    config = {
        **DENSE,
        "model_type": "deepseek_v3",
        "moe_intermediate_size": 32,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
    }
    del config["num_key_value_heads"]
    shape = read_shape(config)
    assert (shape.heads, shape.kv_heads, shape.kv_lora_rank, shape.rope_head_dim) == (4, 4, 512, 64)


def test_the_dtype_is_the_top_levels_then_text_configs():
    text = {**DENSE, "model_type": "llama", "torch_dtype": "bfloat16"}
    wrapped = {"model_type": "pixtral", "text_config": text}
    assert read_shape({**wrapped, "torch_dtype": "float32"}).dtype == "float32"
    assert read_shape(wrapped).dtype == "bfloat16"
    assert read_shape({**DENSE, "model_type": "llama"}).dtype == "float16"


def test_reading_a_config_leaves_it_as_it_was():
    text = {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
    }
    config = {"model_type": "gemma3", "text_config": text}
    before = json.dumps(config, sort_keys=True)
    read_shape(config)
    assert json.dumps(config, sort_keys=True) == before


def test_a_shared_expert_is_one_the_model_has():
    moe = {**DENSE, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "num_experts": 4}
    qwen = read_shape({**moe, "model_type": "qwen2_moe", "shared_expert_intermediate_size": 48})
    assert (qwen.experts, qwen.shared_expert_width) == (4, 48)
    # MiniMax's config names a shared width that its mlx-lm model has no expert for
    minimax = {
        **moe,
        "model_type": "minimax",
        "num_local_experts": 4,
        "shared_intermediate_size": 48,
        "rotary_dim": 16,
    }
    assert read_shape(minimax).shared_expert_width == 0
