"""Model sources: default GGUF, a Llama GGUF file, an MLX folder, a HF repo
id offline, bad settings."""

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model, load_tokenizer
from ringutil import make_tiny_model

import mlx_ring.models.gguf_convert as gc
import mlx_ring.models.source as ms


def test_default_model_is_converted_once_with_config_and_chat_template(default_model, cache_dir):
    config = json.loads((default_model / "config.json").read_text())
    assert (
        config["model_type"] == "llama"
        and config["num_hidden_layers"] == 30
        and config["tie_word_embeddings"]
    )
    tokenizer = load_tokenizer(default_model)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert "<|im_start|>user\nhi<|im_end|>" in text
    # cached: same folder, no work
    assert ms.resolve_model(None, cache_dir, "auto") == default_model


def _permute_rows(w, n_head):
    # What llama.cpp's converter does to q/k rows (HF -> GGUF order).
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _tiny_gguf(tmp_path, kind="llama"):
    """A tiny model written as GGUF the way llama.cpp lays it out, plus the MLX
    model it came from."""
    folder = make_tiny_model(tmp_path / "ref", kind, n_layers=2)
    config = json.loads((folder / "config.json").read_text())
    ref = dict(tree_flatten(load_model(folder)[0].parameters()))
    # Borrow a real tokenizer description from the default GGUF (vocab must match: 49152 tokens).
    _, meta = mx.load(str(ms.default_gguf_path()), return_metadata=True)
    vocab = len(meta["tokenizer.ggml.tokens"])
    mx.random.seed(1)
    ref["model.embed_tokens.weight"] = 0.02 * mx.random.normal((vocab, 64))
    if not config["tie_word_embeddings"]:
        ref["lm_head.weight"] = 0.02 * mx.random.normal((vocab, 64))
    arch = "llama" if kind == "mistral" else kind  # llama.cpp writes Mistral as llama
    names = {v: k for k, v in gc.BLOCK_NAMES["llama"].items()}
    tensors = {}
    for k, v in ref.items():
        if k.startswith("model.layers."):
            _, _, i, rest = k.split(".", 3)
            mod, leaf = rest.rsplit(".", 1)
            if arch == "llama" and mod == "self_attn.q_proj":  # only the llama converter permutes
                v = _permute_rows(v, config["num_attention_heads"])
            elif arch == "llama" and mod == "self_attn.k_proj":
                v = _permute_rows(v, config["num_key_value_heads"])
            tensors[f"blk.{i}.{names[mod]}.{leaf}"] = v
        else:
            top = {
                "model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight",
            }
            tensors[top[k]] = v
    keep = {k: v for k, v in meta.items() if k.startswith("tokenizer.")}
    u32 = lambda x: mx.array(x, dtype=mx.uint32)  # noqa: E731
    f32 = lambda x: mx.array(x, dtype=mx.float32)  # noqa: E731
    keep.update(
        {
            "general.architecture": arch,
            f"{arch}.block_count": u32(2),
            f"{arch}.embedding_length": u32(64),
            f"{arch}.feed_forward_length": u32(128),
            f"{arch}.attention.head_count": u32(4),
            f"{arch}.attention.head_count_kv": u32(config["num_key_value_heads"]),
            f"{arch}.attention.key_length": u32(config.get("head_dim", 16)),
            f"{arch}.attention.layer_norm_rms_epsilon": f32(config["rms_norm_eps"]),
            f"{arch}.rope.freq_base": f32(config["rope_theta"]),
            f"{arch}.context_length": u32(512),
        }
    )
    path = tmp_path / "tiny.gguf"
    mx.save_gguf(str(path), tensors, keep)
    return path, ref


@pytest.fixture(scope="module")
def default_tokenizer(tmp_path_factory):
    """The default GGUF's tokenizer, converted here afresh (not the machine's cached conversion);
    once for the file, as the conversion takes seconds."""
    return load_tokenizer(ms.resolve_model(None, tmp_path_factory.mktemp("c2"), "float32"))


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "qwen3"])
def test_gguf_file_converts_to_the_model_it_came_from(tmp_path, kind, default_tokenizer):
    path, ref = _tiny_gguf(tmp_path, kind)
    folder = ms.resolve_model(str(path), tmp_path / "cache", "float32")
    got = dict(tree_flatten(load_model(folder)[0].parameters()))
    assert set(got) == set(ref)
    for k in ref:  # names mapped and (llama) q/k rows un-permuted exactly
        np.testing.assert_array_equal(np.array(got[k]), np.array(ref[k]), err_msg=k)
    assert load_tokenizer(folder).encode("hello world") == default_tokenizer.encode("hello world")


def test_default_gguf_quantized_keeps_q4_and_matches_dequantized(cache_dir):
    q = ms.resolve_model(None, cache_dir, "keep")
    config = json.loads((q / "config.json").read_text())
    # Q4_1 blocks everywhere but the embedding, which this file stores at 8
    # bits: a per-module override.
    assert config["quantization"] == {
        "group_size": 32,
        "bits": 4,
        "model.embed_tokens": {"group_size": 32, "bits": 8},
    }
    qm, _ = load_model(q)
    fm, _ = load_model(ms.resolve_model(None, cache_dir, "float32"))
    tokens = mx.array([[1, 504, 3458, 282, 4649]])
    q_logits, f_logits = np.array(qm(tokens)), np.array(fm(tokens))
    # Same weights; only the activation precision differs (float16 scales vs float32).
    np.testing.assert_allclose(q_logits, f_logits, rtol=1e-2, atol=0.1)
    assert (q_logits.argmax(-1) == f_logits.argmax(-1)).all()


def test_mlx_folder_is_used_as_is(tmp_path):
    folder = make_tiny_model(tmp_path / "m", "qwen3", n_layers=2)
    assert ms.resolve_model(str(folder), tmp_path / "cache") == folder.resolve()


def test_bad_sources_say_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="does not exist"):
        ms.resolve_model(str(tmp_path / "missing.gguf"), tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        ms.resolve_model(str(tmp_path / "empty"), tmp_path)
    with pytest.raises(ValueError, match="neither a folder"):
        ms.resolve_model("not a model", tmp_path)
    with pytest.raises(ValueError, match="weights"):
        ms.resolve_model(None, tmp_path, "int3")


def test_hf_repo_offline_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="not in the local cache"):
        ms.resolve_model("someone/some-model", tmp_path)
