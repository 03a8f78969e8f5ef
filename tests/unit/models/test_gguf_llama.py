"""A Llama's GGUF as llama.cpp's Q4_K_M and Q5_K_M leave it (K-quants beside Q6_K and F32), written
from a tiny random model (ggufutil.py): equal to its dequantized weights in float32, and stored as
MLX's quantization within what the file's own quantization moved."""

import json

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from ggufutil import _as_gguf, _held_as_params, _random_model, _smollm2_vocab, _typed, _write_gguf
from mlx.utils import tree_flatten
from mlx_lm.models import llama
from mlx_lm.utils import load_model, load_tokenizer

import mlx_ring.models.source as ms

LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "vocab_size": 49152,
    "tie_word_embeddings": False,
}
# As llama.cpp's Q4_K_M and Q5_K_M: Q6_K for attn_v, ffn_down and the output, Q4_K
# (Q5_K) for the rest.
MIXES = {
    name: {
        "attn_v": T.Q6_K,
        "ffn_down": T.Q6_K,
        "output": T.Q6_K,
        "token_embd": t,
        "attn": t,
        "ffn": t,
    }
    for name, t in (("Q4_K_M", T.Q4_K), ("Q5_K_M", T.Q5_K))
}


def _llama_gguf(tmp_path, mix):
    model, params = _random_model(llama, LLAMA, seed=3)
    gguf = _as_gguf(params, LLAMA, "llama")
    numbers = {
        "block_count": 2,
        "embedding_length": 256,
        "feed_forward_length": 512,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
        "attention.key_length": 64,
        "attention.layer_norm_rms_epsilon": 1e-5,
        "rope.freq_base": 10000.0,
        "context_length": 512,
    }
    held = _write_gguf(
        tmp_path / f"tiny-{mix}.gguf", "llama", _typed(gguf, MIXES[mix]), numbers, _smollm2_vocab()
    )
    model.load_weights(_held_as_params(held, gguf, LLAMA, "llama"))
    return tmp_path / f"tiny-{mix}.gguf", model, params


@pytest.mark.parametrize("mix,bits", [("Q4_K_M", 4), ("Q5_K_M", 5)])
def test_k_quant_llama_loads_as_mlx_quantization_and_matches_its_dequantized_weights(
    tmp_path, mix, bits
):
    path, ref, original = _llama_gguf(tmp_path, mix)
    types = {t.tensor_type.name for t in GGUFReader(path).tensors}
    assert types == {f"Q{bits}_K", "Q6_K", "F32"}

    # float32: exactly the values gguf's dequantization gives, names mapped and q/k rows un-permuted
    f32 = ms.resolve_model(str(path), tmp_path / "cache", "float32")
    got = dict(tree_flatten(load_model(f32)[0].parameters()))
    for k, v in tree_flatten(ref.parameters()):
        np.testing.assert_array_equal(np.array(got[k]), np.array(v), err_msg=k)

    # keep: MLX's own quantization, 4 (5) bits for Q4_K (Q5_K) and 8 bits for Q6_K (group 32)
    q = ms.resolve_model(str(path), tmp_path / "cache", "keep")
    config = json.loads((q / "config.json").read_text())
    quant = config["quantization"]
    assert (quant["bits"], quant["group_size"]) == (bits, 32)
    eights = sorted(k for k, v in quant.items() if isinstance(v, dict) and v["bits"] == 8)
    assert eights == ["lm_head"] + [
        f"model.layers.{i}.{m}" for i in range(2) for m in ("mlp.down_proj", "self_attn.v_proj")
    ]
    qmodel, _ = load_model(q)
    tokens = mx.array([[1, 504, 3458, 282, 4649, 30, 2000, 17]])
    ref_logits, q_logits = np.array(ref(tokens)), np.array(qmodel(tokens))
    # Q4_K/Q5_K blocks are MLX's groups exactly and Q6_K goes to 8 bits, so what storing adds
    # (float16 scales and activations; 0.010 here) is a fifth of what the file's own quantization
    # moved the logits (0.14, 0.075), and under 5% of their spread (0.26).
    orig = llama.Model(llama.ModelArgs.from_dict(LLAMA))
    orig.load_weights(list(original.items()))
    file_error = np.abs(np.array(orig(tokens)) - ref_logits).max()
    ours = np.abs(q_logits - ref_logits).max()
    assert ours < 0.2 * file_error, (ours, file_error)
    assert ours < 0.05 * ref_logits.std()
    assert load_tokenizer(q).encode("hello world") == load_tokenizer(f32).encode("hello world")
