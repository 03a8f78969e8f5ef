"""GGUF files written for the tests with the gguf package's writer, as llama.cpp's converter
writes them: a tiny random mlx-lm model's tensors under GGUF's names (llama's q/k rows permuted,
Gemma 3's norms as 1 + weight), each in its tensor type (K-quant blocks from tests/kquants.py),
with the vocabulary given (the default model's, read from its GGUF header, for one); and the values
the file holds back under mlx-lm's names."""

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize
from kquants import quantize as quantize_k
from mlx.utils import tree_flatten

import mlx_ring.models.gguf_convert as gc
import mlx_ring.models.source as ms


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
    """The values the file holds, under mlx-lm's names (q/k rows back in order,
    Gemma's norms less 1)."""
    out = []
    for name, (k, _) in gguf.items():
        v = mx.array(held[name])
        if arch == "llama" and ("attn_q." in name or "attn_k." in name):
            v = gc._unpermute_rows(
                v, config["num_attention_heads" if "attn_q." in name else "num_key_value_heads"]
            )
        out.append((k, v - 1 if arch == "gemma3" and name.endswith("norm.weight") else v))
    return out
