"""GGUF files into MLX model folders: the header checked first, tensors read (`gguf_tensors.py`),
config and tokenizer rebuilt.

The header (architecture, tensor types) is read with the `gguf` package's reader, which reads no
tensor data, so a file this converter cannot serve is refused in a sentence before anything loads.
"""

import json
import logging
import os
import shutil
from pathlib import Path

import mlx.core as mx
from gguf import GGUFReader
from tqdm import tqdm

from mlx_ring.models.gguf_tensors import GROUP_SIZE, MLX_BITS, read_tensors

log = logging.getLogger(__name__)

# llama.cpp tensor names -> mlx_lm (Hugging Face) names, per architecture.
_BLOCK_NAMES = {
    "attn_q_norm": "self_attn.q_norm",  # Qwen3, Gemma 3
    "attn_k_norm": "self_attn.k_norm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
# Gemma 3 norms the block around the attention and the MLP both before and after.
_GEMMA3_NAMES = dict(
    _BLOCK_NAMES,
    ffn_norm="pre_feedforward_layernorm",
    post_attention_norm="post_attention_layernorm",
    post_ffw_norm="post_feedforward_layernorm",
)
BLOCK_NAMES = {
    "llama": _BLOCK_NAMES,
    "qwen2": _BLOCK_NAMES,
    "qwen3": _BLOCK_NAMES,
    "gemma3": _GEMMA3_NAMES,
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# GGUF architectures read -> (mlx_lm model_type, Hugging Face class). llama.cpp
# writes Mistral as llama.
ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
}
# Tokens that end a turn in common chat templates (as llama.cpp's list of end-of-generation tokens).
_END_OF_TURN = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>")


def read_header(path: Path) -> tuple[dict, list]:
    """A GGUF file's metadata and tensor list, refusing an architecture or tensor type that
    cannot be served."""
    try:
        reader = GGUFReader(path)
    except Exception as e:  # a truncated file, or a tensor type newer than the gguf package knows
        raise ValueError(
            f"cannot read the GGUF header of {path}: {e}; check the file is whole and a GGUF model"
        ) from e
    meta = {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("GGUF.")}
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)} "
            "(Mistral files are written as llama); use an MLX folder or repo id "
            "of the model instead"
        )
    bad = sorted({t.tensor_type.name for t in reader.tensors if t.tensor_type not in MLX_BITS})
    if bad:
        raise ValueError(
            f"tensor type {', '.join(bad)} is not supported ({path.name}); GGUF tensors of type "
            f"{', '.join(t.name for t in MLX_BITS)} are read: use the model's "
            "Q4_K_M, Q5_K_M, Q6_K or Q8_0 file"
        )
    return meta, reader.tensors


def config_from_gguf(meta: dict, tensor_names: set[str]) -> dict:
    """An mlx_lm config.json dict from a GGUF file's metadata."""
    arch = meta["general.architecture"]

    def key(name, default=None):
        v = meta.get(f"{arch}.{name}", default)
        if v is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{name}; the file is incomplete")
        return v

    heads, hidden, blocks = key("attention.head_count"), key("embedding_length"), key("block_count")
    model_type, cls = ARCHITECTURES[arch]
    config = {
        "model_type": model_type,
        "architectures": [cls],
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": blocks,
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": key("attention.key_length", hidden // heads),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "rope_theta": key("rope.freq_base", 1_000_000.0 if arch == "gemma3" else 10000.0),
        "max_position_embeddings": key("context_length", 4096),
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    if arch == "gemma3":
        # What llama.cpp's gemma3 graph assumes where the file does not say: local layers'
        # RoPE base, every sixth layer global, and the query scale (27B, 62 layers, scales
        # by hidden / heads).
        config.update(
            rope_local_base_freq=10000.0,
            sliding_window=key("attention.sliding_window", 512),
            sliding_window_pattern=_window_pattern(
                key("attention.sliding_window_pattern", 6), blocks
            ),
            query_pre_attn_scalar=hidden // heads if blocks == 62 else config["head_dim"],
        )
        # global layers only, as in Hugging Face's config
        if meta.get(f"{arch}.rope.scaling.type") == "linear":
            config["rope_scaling"] = {"rope_type": "linear", "factor": key("rope.scaling.factor")}
    if "tokenizer.ggml.bos_token_id" in meta:
        config["bos_token_id"] = meta["tokenizer.ggml.bos_token_id"]
    if "tokenizer.ggml.eos_token_id" in meta:
        config["eos_token_id"] = _end_tokens(meta)
    return config


def _window_pattern(pattern: int | list, blocks: int) -> int:
    # llama.cpp writes either n (every n-th layer global) or a flag per layer (True: sliding);
    # mlx-lm takes n.
    if isinstance(pattern, int):
        return pattern
    n = pattern.index(False) + 1 if False in pattern else blocks + 1
    if pattern != [(i + 1) % n != 0 for i in range(blocks)]:
        raise ValueError(
            f"the file's sliding-window layers {pattern} are not every n-th layer global, "
            "which mlx-lm's gemma3_text needs; use an MLX folder of the model instead"
        )
    return n


def _end_tokens(meta: dict) -> int | list[int]:
    # GGUF names one end token; a chat template ends turns with another (Gemma's <end_of_turn>),
    # which llama.cpp also stops at. Those the template writes join the end token, as Hugging Face's
    # configs list them.
    eos, tokens = meta["tokenizer.ggml.eos_token_id"], meta["tokenizer.ggml.tokens"]
    template = meta.get("tokenizer.chat_template") or ""
    ids = [eos] + [
        tokens.index(t)
        for t in _END_OF_TURN
        if t in template and t in tokens and tokens.index(t) != eos
    ]
    return ids if len(ids) > 1 else eos


def _unpermute_rows(x: mx.array, n_head: int) -> mx.array:
    # llama.cpp reorders q/k rows per head for its interleaved RoPE: (n_head, 2, hd/2) ->
    # (n_head, hd/2, 2). Undo it: rows of weight, scales and biases alike, since quantization
    # groups run along columns.
    shape = x.shape
    return x.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def gguf_weights_to_mlx(weights: dict, config: dict, dequantize: bool) -> tuple[dict, dict | None]:
    """Rename, un-permute and optionally dequantize GGUF tensors;
    returns (weights, quantization)."""
    arch = {v[0]: k for k, v in ARCHITECTURES.items()}[config["model_type"]]
    names = BLOCK_NAMES[arch]
    out = {}
    quant: dict = {}
    for name, w in weights.items():
        stem, leaf = name.rsplit(".", 1)
        parts = stem.split(".")
        if parts[0] == "blk":
            if parts[2] not in names:
                raise ValueError(
                    (
                        f"GGUF tensor {name} is not part of a {config['model_type']} block; the "
                        "file is of another architecture"
                    )
                )
            path = f"model.layers.{parts[1]}.{names[parts[2]]}"
            if parts[2] in ("attn_q", "attn_k") and arch == "llama" and leaf != "bias":
                # only llama.cpp's llama converter permutes (for its RoPE); the others
                # keep Hugging Face's order
                heads = config[
                    "num_attention_heads" if parts[2] == "attn_q" else "num_key_value_heads"
                ]
                w = _unpermute_rows(w, heads)
        elif stem in _TOP_NAMES:
            path = _TOP_NAMES[stem]
        else:
            continue  # e.g. rope_freqs: recomputed by the model from rope_theta
        if arch == "gemma3" and stem.endswith("norm") and leaf == "weight":
            # llama.cpp folds Gemma's (1 + weight) into the stored norm; mlx-lm adds the 1 itself
            w = w - 1
        out[f"{path}.{leaf}"] = w
        if leaf == "scales":
            quant[path] = {
                "group_size": GROUP_SIZE,
                "bits": weights[f"{stem}.weight"].shape[-1] // w.shape[-1],
            }

    if dequantize:
        for path, q in quant.items():
            w = mx.dequantize(
                out.pop(f"{path}.weight"), out.pop(f"{path}.scales"), out.pop(f"{path}.biases"), **q
            )
            out[f"{path}.weight"] = w.astype(mx.float32)
        out = {k: v.astype(mx.float32) for k, v in out.items()}
        return out, None
    if not quant:
        return out, None
    # The most common setting is the default; the rest are per-module overrides mlx_lm understands.
    settings = [tuple(sorted(q.items())) for q in quant.values()]
    default = dict(max(set(settings), key=settings.count))
    quantization = dict(default)
    quantization.update({p: q for p, q in quant.items() if q != default})
    return out, quantization


def save_gguf_tokenizer(meta: dict, out: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json (with the chat template)
    built from GGUF metadata."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    # As transformers' get_gguf_tokenizer, but from the metadata already read.
    def group(renames):
        return {
            name: meta[f"tokenizer.{k}"] for k, name in renames.items() if f"tokenizer.{k}" in meta
        }

    tokenizer_dict = group(GGUF_TOKENIZER_MAPPING["tokenizer"])
    config = group(GGUF_TOKENIZER_MAPPING["tokenizer_config"])
    if tokenizer_dict.get("tokenizer_type") == "llama":
        # llama.cpp adds BOS to a sentencepiece vocab that does not say
        config.setdefault("add_bos_token", True)
    for name, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unk_token_id"),
        ("pad_token", "pad_token_id"),
    ):
        if key in tokenizer_dict:
            config[name] = tokenizer_dict["tokens"][tokenizer_dict[key]]
    backend, _ = convert_gguf_tokenizer(meta["general.architecture"], tokenizer_dict)
    PreTrainedTokenizerFast(tokenizer_object=backend, **config).save_pretrained(str(out))


def convert_gguf(gguf_path: Path, cache_dir: Path, weights: str, name: str | None = None) -> Path:
    """Convert a GGUF file to an MLX folder once; later calls return the cached folder."""
    stat = gguf_path.stat()
    tag = f"{name or gguf_path.stem}-{stat.st_size}-{'f32' if weights == 'float32' else 'q'}"
    out = cache_dir / "models" / tag
    if (out / "config.json").is_file():
        return out
    meta, tensor_list = read_header(gguf_path)
    log.info("converting %s to an MLX folder at %s (once)", gguf_path, out)
    raw = read_tensors(gguf_path, tensor_list, to_float32=weights == "float32")
    config = config_from_gguf(meta, set(raw))
    tensors, quantization = gguf_weights_to_mlx(raw, config, dequantize=weights == "float32")
    if quantization:
        config["quantization"] = quantization
    for w in tqdm(
        tensors.values(),
        desc=f"converting {gguf_path.name}",
        unit="tensor",
        disable=None,
        leave=False,
    ):
        mx.eval(w)  # one by one, so a terminal shows how far it is
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_gguf_tokenizer(meta, tmp)
        mx.save_safetensors(str(tmp / "model.safetensors"), tensors, metadata={"format": "mlx"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # Atomic publish so concurrent ranks or a killed conversion never leave a half-written folder.
    try:
        tmp.rename(out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / "config.json").is_file():
            raise
    return out
