"""What a rank's forward passes hold beside its weights and caches: the intermediate arrays of a
prefill chunk or a decode step, estimated from the model's shape and the serving settings. Pure, no
MLX: the plan counts it as each rank's runtime, and the scheduler keeps the prefill work it has on the
device at once within the tokens it counts (`step_tokens`)."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlx_ring.planning.capabilities import Capabilities
    from mlx_ring.planning.plan import ModelSpec

CHUNK = 512  # prompt tokens per prefill step where PREFILL_CHUNK is auto: the most any device takes
SCORE_BYTES = 4  # attention computed unfused (a CPU always) keeps its scores and softmax in float32


def holds_graph(cap: "Capabilities") -> bool:
    """Whether the device keeps a graph's intermediates until the whole graph has run, so every layer
    of a stage counts: a GPU through CUDA does (0.9-1.6 GiB for 16 layers of an 8B shape with 512-token
    chunks, measured on an H200); a CPU and Metal free each array once the next ones are made
    (tools/probe_activations.py: 18 MiB for 15 layers' chunk on a CPU, about one layer's)."""
    return cap.device.startswith(("NVIDIA", "Tesla"))  # CUDA's device names


def metal(cap: "Capabilities") -> bool:
    """A Mac, probed (a recommended working set) or declared in hosts.json (an Apple device, or none named)."""
    return bool(cap.working_set_gb) or cap.device.startswith("Apple") or not cap.device


def step_tokens(model: "ModelSpec") -> int:
    """Tokens of forward work a rank holds intermediates for at once, as the plan counts them: a prefill
    chunk (`model.prefill_chunk`, or `CHUNK`) or a decode step of `model.max_active` rows, whichever is
    more. The scheduler keeps the prefill chunks on the device at once (rows x tokens, over every
    prompt prefilled together) within this many tokens, so the figure holds for any burst of prompts."""
    return max(model.prefill_chunk or CHUNK, model.max_active)


def activation_bytes(model: "ModelSpec", cap: "Capabilities", rank: int, n: int, context: int) -> float:
    """The bytes of intermediate arrays rank `rank` holds at its peak with `n` layers: `step_tokens`
    tokens through every layer where the device holds a graph's intermediates (else one); off
    Metal, one layer's attention scores for the chunk against `context` keys (at most the model's
    context); on rank 0 the head's float32 logits of every row, with their softmax."""
    chunk = model.prefill_chunk or CHUNK
    tokens = step_tokens(model)
    held = n if holds_graph(cap) else min(n, 1)
    # Metal attends in one fused kernel; elsewhere a prompt's attention may run unfused (always on a CPU).
    keys = min(context, model.context_length or context)  # no prompt is longer than the model's context
    scores = 2 * model.heads * chunk * keys * SCORE_BYTES if n and not metal(cap) else 0
    head = 2 * model.max_active * model.vocab * 4 if rank == 0 else 0  # the logits and their softmax
    return held * tokens * model.act_bytes_per_token + scores + head
