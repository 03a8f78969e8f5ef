"""The shapes and machines the mode tests plan, and `choose`: PARALLEL=auto's plan of one. The
shapes are those measured on 2 x H100 (mlx-lm's shard() under mlx.launch): the Llama-3-8B
shape over `--backend ring` ran at 0.11-0.31x one GPU, a 20-layer cut of the Llama-70B shape
over NCCL at 1.60x."""

from mlx_ring.planning.auto import plan_mode
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.modes import AllSum
from mlx_ring.planning.plan import ModelSpec
from mlx_ring.planning.split import even_sizes

# Llama-3-8B, bfloat16: 218M parameters a layer, 525M in each of the embedding and the head.
LLAMA_8B = ModelSpec(
    32,
    436e6,
    2 * 1.05e9,
    1.05e9,
    4096,
    436e6,
    2 * 218e6,
    2 * 525e6,
    "bfloat16",
    "8b",
    hidden_bytes=4096 * 2,
)
# 20 layers of the Llama-70B shape, bfloat16: 856M parameters a layer, a 128256 x
# 8192 embedding and head.
LLAMA_70B_CUT = ModelSpec(
    20,
    1.712e9,
    2 * 2.1e9,
    2.1e9,
    4096,
    1.712e9,
    2 * 856e6,
    2 * 1.05e9,
    "bfloat16",
    "70b-20",
    hidden_bytes=8192 * 2,
)
H100_4 = [
    Capabilities("gpu-box", 80, 70, 500, 2800, "NVIDIA H100", unit=f"GPU {i}") for i in range(4)
]
H100 = H100_4[:2]
LLAMA_CONFIG = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
}
HALVES = even_sizes(2)
TCP_1MS = AllSum(1.0, 1.25, 2, "ring (TCP)", "as measured on 2 x H100 through the host")


def choose(spec, caps, allsum, parallel="auto", split=None, **kw):
    n = len(caps)
    return plan_mode(
        spec,
        caps,
        None,
        parallel,
        "balanced",
        8192,
        split=split or even_sizes(n),
        allsum=allsum,
        **kw,
    )
