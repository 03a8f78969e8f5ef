"""GGUF files as people have them: K-quants (Q4_K, Q5_K, Q6_K) mixed with Q5_0/Q8_0/F32, Gemma 3,
and files refused from their header. Each file is written here with the gguf package's writer
from a tiny random model; K-quant blocks come from tests/kquants.py, checked by gguf's own
dequantization."""

import json

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize
from kquants import quantize as quantize_k
from mlx.utils import tree_flatten
from mlx_lm.models import gemma3_text, llama
from mlx_lm.utils import load_model, load_tokenizer

import mlx_ring.models.gguf_convert as gc
import mlx_ring.models.gguf_tensors as gt
import mlx_ring.models.source as ms


@pytest.mark.parametrize("qtype,levels", [(T.Q4_K, 15), (T.Q5_K, 31), (T.Q6_K, 63)])
def test_kquant_blocks_read_back_within_a_step(qtype, levels):
    rng = np.random.default_rng(0)
    w = (rng.normal(size=(6, 512)) * 0.05).astype(np.float32)
    back = dequantize(quantize_k(w, qtype), qtype)
    # Every value within one quantization step of its sub-block (32 values; 16 for Q6_K, symmetric).
    sub = w.reshape(-1, 16 if qtype == T.Q6_K else 32)
    step = (
        2 * np.abs(sub).max(-1) if qtype == T.Q6_K else sub.max(-1) - np.minimum(sub.min(-1), 0)
    ) / levels
    assert (np.abs(back - w).reshape(sub.shape) <= step[:, None]).all()
    # a half step on average, as rounding gives
    assert np.abs(back - w).mean() < 0.6 * step.mean() / 2 + 1e-6


def _encode(w: np.ndarray, qtype: T) -> np.ndarray:
    if qtype in (T.F32, T.F16):
        return w.astype(np.float32 if qtype == T.F32 else np.float16)
    return quantize_k(w, qtype) if qtype in (T.Q4_K, T.Q5_K, T.Q6_K) else quantize(w, qtype)


def _write_gguf(path, arch: str, tensors: dict, numbers: dict, vocab: dict) -> dict:
    """Write a GGUF file of tensors {gguf name: (float array, type)}; returns each tensor as the
    file holds it."""
    writer = GGUFWriter(str(path), arch)
    for key, v in numbers.items():
        (writer.add_uint32 if isinstance(v, int) else writer.add_float32)(f"{arch}.{key}", v)
    writer.add_tokenizer_model(vocab["model"])
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["token_type"])
    for key in ("scores", "merges"):
        if key in vocab:
            (writer.add_token_scores if key == "scores" else writer.add_token_merges)(vocab[key])
    writer.add_bos_token_id(vocab["bos"])
    writer.add_eos_token_id(vocab["eos"])
    writer.add_chat_template(vocab["chat_template"])
    for key in ("add_space_prefix", "add_bos_token"):
        if key in vocab:
            (
                writer.add_add_space_prefix
                if key == "add_space_prefix"
                else writer.add_add_bos_token
            )(vocab[key])
    held = {}
    for name, (w, qtype) in tensors.items():
        data = _encode(np.asarray(w, dtype=np.float32), qtype)
        writer.add_tensor(name, data, raw_dtype=None if qtype in (T.F32, T.F16) else qtype)
        held[name] = (
            dequantize(data, qtype) if qtype not in (T.F32, T.F16) else data.astype(np.float32)
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return held


def _smollm2_vocab() -> dict:
    # The default model's real byte-level vocabulary (49152 tokens), read from its GGUF header.
    reader = GGUFReader(ms.default_gguf_path())
    f = {
        k: reader.fields[f"tokenizer.{k}"].contents()
        for k in ("ggml.tokens", "ggml.token_type", "ggml.merges", "chat_template")
    }
    return {
        "model": "gpt2",
        "tokens": f["ggml.tokens"],
        "token_type": f["ggml.token_type"],
        "merges": f["ggml.merges"],
        "bos": 1,
        "eos": 2,
        "chat_template": f["chat_template"],
    }


def _random_model(module, config: dict, seed: int, tied: bool = False):
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    if tied:
        model.sanitize({})  # as mlx-lm loads a checkpoint without lm_head
    params = {k: v for k, v in tree_flatten(model.parameters())}
    for k, v in params.items():  # norms away from their init, so a norm mapped wrongly shows
        params[k] = (
            0.05 * mx.random.normal(v.shape) if v.ndim == 2 else 0.3 * mx.random.normal(v.shape)
        )
    return model, params


def _permute_rows(w, n_head):
    # What llama.cpp's converter does to llama's q/k rows (Hugging Face -> GGUF order).
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _as_gguf(params: dict, config: dict, arch: str) -> dict:
    """{gguf name: (mlx-lm name, value as llama.cpp's converter writes it)}."""
    names = {v: k for k, v in gc.BLOCK_NAMES[arch].items()}
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    out = {}
    for k, v in params.items():
        v = np.array(v)
        if k in top:
            name = top[k]
        else:
            _, _, i, rest = k.split(".", 3)
            mod, leaf = rest.rsplit(".", 1)
            name = f"blk.{i}.{names[mod]}.{leaf}"
            if arch == "llama" and mod in ("self_attn.q_proj", "self_attn.k_proj"):
                v = _permute_rows(
                    v, config["num_attention_heads" if "q_proj" in mod else "num_key_value_heads"]
                )
        if arch == "gemma3" and k.endswith("norm.weight"):
            v = v + 1  # llama.cpp's Gemma 3 converter stores 1 + weight
        out[name] = (k, v)
    return out


def _typed(gguf: dict, types: dict) -> dict:
    # Norms and other vectors stay F32, as in every llama.cpp quantization; a matrix takes the first
    # type whose key starts its name's part ("attn_v" of blk.0.attn_v.weight).
    def pick(name):
        return next(t for key, t in types.items() if name.split(".")[-2].startswith(key))

    return {name: (v, T.F32 if v.ndim == 1 else pick(name)) for name, (_, v) in gguf.items()}


def _held_as_params(held: dict, gguf: dict, config: dict, arch: str) -> list:
    """The values the file holds, under mlx-lm's names (q/k rows back in order, Gemma's norms
    less 1)."""
    out = []
    for name, (k, _) in gguf.items():
        v = mx.array(held[name])
        if arch == "llama" and ("attn_q." in name or "attn_k." in name):
            v = gc._unpermute_rows(
                v, config["num_attention_heads" if "attn_q." in name else "num_key_value_heads"]
            )
        out.append((k, v - 1 if arch == "gemma3" and name.endswith("norm.weight") else v))
    return out


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
# As llama.cpp's Q4_K_M and Q5_K_M: Q6_K for attn_v, ffn_down and the output, Q4_K (Q5_K) for the
# rest.
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
    # As a small Gemma 3's Q4_K_M: rows of 256 take K-quants; Q5_0 and Q8_0 stand in where llama.cpp
    # falls back.
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
    # Gemma's vocabulary adds no space before the text (the file says add_space_prefix false, as
    # Gemma's do)
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


def test_each_tensor_type_is_stored_as_the_table_says(tmp_path):
    rng = np.random.default_rng(2)
    w = (rng.normal(size=(8, 256)) * 0.05).astype(np.float32)
    types = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]
    writer = GGUFWriter(str(tmp_path / "all.gguf"), "llama")
    held = {}
    for t in types:
        data = _encode(w, t) if t != T.BF16 else quantize(w, T.BF16)
        writer.add_tensor(
            f"{t.name}.weight",
            data,
            raw_dtype=t if t == T.BF16 else None if t in (T.F32, T.F16) else t,
        )
        held[t] = dequantize(data, t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _, tensors = gc.read_header(tmp_path / "all.gguf")
    kept = gt.read_tensors(tmp_path / "all.gguf", tensors, to_float32=False)
    f32 = gt.read_tensors(tmp_path / "all.gguf", tensors, to_float32=True)
    for t in types:
        name, bits = t.name, gt.MLX_BITS[t]
        np.testing.assert_array_equal(np.array(f32[f"{name}.weight"]), held[t], err_msg=name)
        if bits is None:
            assert (
                kept[f"{name}.weight"].dtype
                == {T.F32: mx.float32, T.F16: mx.float16, T.BF16: mx.bfloat16}[t]
            )
            got = kept[f"{name}.weight"].astype(mx.float32)
        else:
            scales, biases = kept[f"{name}.scales"], kept[f"{name}.biases"]
            assert scales.dtype == mx.float16 and scales.shape == (8, 256 // 32)
            got = mx.dequantize(
                kept[f"{name}.weight"],
                scales.astype(mx.float32),
                biases.astype(mx.float32),
                group_size=32,
                bits=bits,
            )
        err = np.abs(np.array(got) - held[t]).max()
        # Exact but for float16 scales and offsets: |scale * q| <= 2 max|w| and |offset| <= max|w|,
        # each within 2^-11 of itself, so within 1.5 * 2^-10 max|w|. Q6_K is requantized at 8 bits:
        # a step of 2 max / 255 against its own of max / 31, so with the float16 rounding under half
        # its own error (0.30 here).
        limit = 0.5 * np.abs(held[t] - w).max() if t == T.Q6_K else 2**-9 * np.abs(w).max()
        assert err <= limit, (name, err, limit)


def _refused(path, match):
    with pytest.raises(ValueError, match=match):
        ms.resolve_model(str(path), path.parent / "cache")
    assert not (path.parent / "cache").exists()


def test_an_architecture_not_read_is_named_before_anything_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(
        gc, "read_tensors", lambda *a, **k: pytest.fail("tensors were read before the refusal")
    )
    _write_gguf(
        tmp_path / "x.gguf",
        "rwkv7",
        {"token_embd.weight": (np.zeros((4, 32)), T.F32)},
        {"block_count": 1},
        _smollm2_vocab(),
    )
    _refused(
        tmp_path / "x.gguf",
        r"GGUF architecture 'rwkv7' is not supported; supported: llama, qwen2, qwen3, gemma3",
    )


def test_a_tensor_type_not_read_is_named_before_anything_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(
        gc, "read_tensors", lambda *a, **k: pytest.fail("tensors were read before the refusal")
    )
    writer = GGUFWriter(str(tmp_path / "iq.gguf"), "llama")
    # IQ2_XS: 74 bytes per 256 values; any bytes will do, as nothing may read them
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 74), np.uint8), raw_dtype=T.IQ2_XS)
    writer.add_tensor("output_norm.weight", np.ones(256, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _refused(tmp_path / "iq.gguf", r"tensor type IQ2_XS is not supported \(iq.gguf\).*Q4_K_M")
