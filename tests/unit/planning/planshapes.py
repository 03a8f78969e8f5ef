"""The model shape the plan tests plan: Llama-3-8B, bfloat16."""

from mlx_ring.planning.plan import ModelSpec

LLAMA_8B = ModelSpec(
    32, 436e6, 2 * 1.05e9, 1.05e9, 4096, 436e6, 2 * 218e6, 2 * 525e6, "bfloat16", "8b"
)
