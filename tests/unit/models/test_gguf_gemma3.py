"""Gemma 3's GGUF files: a tiny Q4_K_M (K-quants with Q5_0/Q8_0 where llama.cpp falls back) loads
with its norms, sliding windows, chat template and end of turn equal to mlx-lm's `gemma3_text`;
and config.json from the metadata of the published models."""

import json

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from ggufutil import _as_gguf, _held_as_params, _random_model, _typed, _write_gguf
from mlx.utils import tree_flatten
from mlx_lm.models import gemma3_text
from mlx_lm.utils import load_model, load_tokenizer

import mlx_ring.models.gguf_convert as gc
import mlx_ring.models.source as ms

GEMMA3 = {
    "model_type": "gemma3_text",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 6,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10000.0,
    "query_pre_attn_scalar": 128,
    "sliding_window": 8,
    "sliding_window_pattern": 6,
    "max_position_embeddings": 1024,
}
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' "
    "else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt "
    "%}<start_of_turn>model\n{% endif %}"
)


def _gemma_vocab() -> dict:
    # A sentencepiece vocabulary as Gemma's GGUF files write one (model "llama", no merges, control
    # tokens).
    # Gemma's ids 0-4, 105, 106
    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    pieces = ["\n", "\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words = [
        "hi",
        "\u2581h",
        "\u2581hi",
        "\u2581t",
        "\u2581th",
        "\u2581the",
        "er",
        "\u2581there",
        "he",
        "re",
    ]
    tokens = special + pieces + words
    return {
        "model": "llama",
        "tokens": tokens,
        "token_type": [3, 3, 3, 2, 3, 3, 3] + [1] * (len(pieces) + len(words)),
        "scores": [0.0] * len(special) + [-float(i) for i in range(len(pieces) + len(words))],
        "bos": 2,
        "eos": 1,
        "chat_template": GEMMA_TEMPLATE,
        "add_space_prefix": False,
        "add_bos_token": True,
    }


def test_gemma3_q4_k_m_loads_with_its_norms_windows_template_and_end_of_turn(tmp_path):
    vocab = _gemma_vocab()
    config = dict(GEMMA3, vocab_size=len(vocab["tokens"]))
    model, params = _random_model(gemma3_text, config, seed=5, tied=True)
    # As a small Gemma 3's Q4_K_M: rows of 256 take K-quants; Q5_0 and Q8_0 stand in
    # where llama.cpp falls back.
    types = {
        "attn_q": T.Q5_0,
        "attn_k": T.Q5_0,
        "attn_v": T.Q8_0,
        "attn_output": T.Q4_K,
        "ffn_down": T.Q6_K,
        "ffn": T.Q4_K,
        "token_embd": T.Q8_0,
    }
    gguf = _as_gguf(params, config, "gemma3")
    numbers = {
        "block_count": 6,
        "embedding_length": 256,
        "feed_forward_length": 512,
        "attention.head_count": 2,
        "attention.head_count_kv": 1,
        "attention.key_length": 128,
        "attention.value_length": 128,
        "attention.layer_norm_rms_epsilon": 1e-6,
        "rope.freq_base": 1_000_000.0,
        "attention.sliding_window": 8,
        "context_length": 1024,
    }
    path = tmp_path / "gemma-3-tiny-Q4_K_M.gguf"
    held = _write_gguf(path, "gemma3", _typed(gguf, types), numbers, vocab)
    # what MLX alone does with it (Q5_0)
    with pytest.raises(RuntimeError, match="gguf_tensor_to_f16 failed"):
        mx.load(str(path))
    model.load_weights(_held_as_params(held, gguf, config, "gemma3"))

    f32 = ms.resolve_model(str(path), tmp_path / "cache", "float32")
    written = json.loads((f32 / "config.json").read_text())
    for key in (
        "sliding_window",
        "sliding_window_pattern",
        "rope_local_base_freq",
        "rope_theta",
        "query_pre_attn_scalar",
        "head_dim",
    ):
        assert written[key] == config[key], key
    assert written["eos_token_id"] == [1, 6]  # <eos>, and the template's <end_of_turn>
    got = dict(tree_flatten(load_model(f32)[0].parameters()))
    for k, v in tree_flatten(model.parameters()):  # norms: the file's 1 + w, less 1 again
        np.testing.assert_allclose(np.array(got[k]), np.array(v), rtol=0, atol=1e-6, err_msg=k)
    # 20 tokens: past the 8-token window of the five local layers; the sixth attends to all of them
    tokens = mx.array([[2] + [7 + (i * 7) % 30 for i in range(19)]])
    ref_logits = np.array(model(tokens))
    np.testing.assert_allclose(np.array(load_model(f32)[0](tokens)), ref_logits, rtol=0, atol=1e-4)
    q_logits = np.array(
        load_model(ms.resolve_model(str(path), tmp_path / "cache", "keep"))[0](tokens)
    )
    assert np.abs(q_logits - ref_logits).max() < 0.1 * ref_logits.std()

    tokenizer = load_tokenizer(f32, eos_token_ids=written["eos_token_id"])
    # Gemma's vocabulary adds no space before the text (the file says add_space_prefix
    # false, as Gemma's do)
    assert tokenizer.encode("hi there", add_special_tokens=False) == [
        vocab["tokens"].index(t) for t in ("hi", "\u2581there")
    ]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    assert ids[:2] == [2, 5]  # one <bos>, then <start_of_turn>
    assert 6 in tokenizer.eos_token_ids
    assert len(tokenizer._tokenizer) == config["vocab_size"]  # no token beyond the model's rows


def test_gemma3_config_from_metadata_as_the_published_configs():
    # Gemma 3 270M and 27B as llama.cpp's converter writes them (no tensors needed): config.json's
    # values as Hugging Face publishes them for these models.
    def meta(blocks, hidden, heads, kv, head_dim, **extra):
        keys = {
            "block_count": blocks,
            "embedding_length": hidden,
            "attention.head_count": heads,
            "feed_forward_length": 4 * hidden,
            "attention.head_count_kv": kv,
            "attention.key_length": head_dim,
            "attention.layer_norm_rms_epsilon": 1e-6,
            "rope.freq_base": 1_000_000.0,
            "attention.sliding_window": 512,
            "context_length": 32768,
            **extra,
        }
        return {
            "general.architecture": "gemma3",
            "tokenizer.ggml.tokens": ["<pad>"] * 8,
            **{f"gemma3.{k}": v for k, v in keys.items()},
        }

    small = gc.config_from_gguf(meta(18, 640, 4, 1, 256), {"token_embd.weight"})
    assert (
        small["query_pre_attn_scalar"],
        small["sliding_window_pattern"],
        small["tie_word_embeddings"],
    ) == (256, 6, True)
    assert "rope_scaling" not in small
    big = gc.config_from_gguf(
        meta(62, 5376, 32, 16, 128, **{"rope.scaling.type": "linear", "rope.scaling.factor": 8.0}),
        set(),
    )
    assert big["query_pre_attn_scalar"] == 168 and big["rope_scaling"] == {
        "rope_type": "linear",
        "factor": 8.0,
    }
    flags = [(i + 1) % 6 != 0 for i in range(18)]  # newer files: a flag per layer
    assert (
        gc.config_from_gguf(
            meta(18, 640, 4, 1, 256, **{"attention.sliding_window_pattern": flags}), set()
        )["sliding_window_pattern"]
        == 6
    )
    with pytest.raises(ValueError, match="not every n-th layer global"):
        gc.config_from_gguf(
            meta(
                18,
                640,
                4,
                1,
                256,
                **{"attention.sliding_window_pattern": [True, False] * 4 + [True] * 10},
            ),
            set(),
        )
