"""The model types this server splits exactly, and the sentence that refuses the others at startup.

A rank runs the model's own forward (mlx-lm's code) on its cut of the layer list
(`mlx_ring.models.slicing`), so masks, scales, soft-capping and cache kinds are mlx-lm's. A type is
listed once a tiny random model of it, split unevenly over 2 and 3 ranks in batches, matches
single-process mlx-lm (tests/ring/test_fidelity.py); others are refused before anything loads.
"""

# model_type (config.json) -> the families it covers, for the README's table.
SUPPORTED = {
    "llama": "Llama 2, Llama 3.x, and Llama-shaped models (GGUF included)",
    "mistral": "Mistral 7B and other Mistral-architecture models (mlx-lm runs them as Llama)",
    "qwen2": "Qwen2, Qwen2.5",
    "qwen3": "Qwen3 (dense)",
    "qwen3_moe": "Qwen3 mixture of experts (every expert held by the rank of its layer)",
    "phi3": "Phi-3, Phi-3.5, Phi-4 mini",
    "gemma2": "Gemma 2 (logit soft-capping; one request per decode group, see below)",
    "gemma3_text": "Gemma 3 1B and other text-only Gemma 3 (sliding-window layers)",
    "gemma3": "Gemma 3 4B and up (text only: images are not served)",
    "gpt_oss": "GPT-OSS (sliding-window layers, attention sinks, experts)",
    "glm4": "GLM-4 (0414)",
    "deepseek_v3": "DeepSeek-V3 and models that declare its type (latent attention, experts)",
    "lfm2": "LFM2 (short-convolution layers with a fixed state beside attention layers)",
}


# Supported types whose layers cannot take several rows at once: each decode group holds one request.
UNBATCHED = {
    "gemma2": "mlx-lm's Gemma 2 attention cannot take a batch's mask with grouped KV heads",
}


def check_supported(config: dict) -> None:
    """ValueError naming the model type and the supported ones, unless it is one of them."""
    kind = config.get("model_type")
    if kind not in SUPPORTED:
        raise ValueError(f"model type {kind!r} is not supported: it is not tested split across ranks against "
                         f"single-process mlx-lm; supported: {', '.join(SUPPORTED)}")


def table() -> str:
    """The README's table of supported model types (tests check that the README holds it)."""
    rows = ["| `model_type` | models |", "| --- | --- |"] + [f"| `{k}` | {v} |" for k, v in SUPPORTED.items()]
    return "\n".join(rows)
