"""The model types this server splits exactly, and the sentence that refuses the others at startup.

A rank runs its layers one by one with masks made one way (`shard.Shard.forward`), the embedding
and final norm and head on rank 0. That is a model's own forward only for the families below, each
tested split unevenly over 2 and 3 ranks against single-process mlx-lm (tests/ring/test_fidelity.py);
others (Gemma's embedding scale and logit soft-capping, MLA or state-space caches, ...) would crash
mid-request or, worse, answer differently, so they are refused before anything loads.
"""

# model_type (config.json) -> the families it covers, for the README's table.
SUPPORTED = {
    "llama": "Llama 2, Llama 3.x, and Llama-shaped models (GGUF included)",
    "mistral": "Mistral 7B and other Mistral-architecture models (mlx-lm runs them as Llama)",
    "qwen2": "Qwen2, Qwen2.5",
    "qwen3": "Qwen3 (dense)",
    "qwen3_moe": "Qwen3 mixture of experts (every expert held by the rank of its layer)",
    "phi3": "Phi-3, Phi-3.5, Phi-4 mini",
}


def check_supported(config: dict) -> None:
    """ValueError naming the model type and the supported ones, unless it is one of them."""
    kind = config.get("model_type")
    if kind not in SUPPORTED:
        raise ValueError(f"model type {kind!r} is not supported: its forward pass does more than this server's split runs "
                         f"(answers would differ from mlx-lm's, or fail mid-request); supported: {', '.join(SUPPORTED)}")


def table() -> str:
    """The README's table of supported model types (tests check that the README holds it)."""
    rows = ["| `model_type` | models |", "| --- | --- |"] + [f"| `{k}` | {v} |" for k, v in SUPPORTED.items()]
    return "\n".join(rows)
