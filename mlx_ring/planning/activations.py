"""What a rank's forward passes hold beside its weights and caches: the intermediate arrays of a
prefill chunk or a decode step, estimated from the model's shape and the serving settings. Pure,
no MLX: the plan counts it as each rank's runtime, and the scheduler keeps the prefill work it
has on the device at once within the tokens it counts (`step_tokens`)."""

from typing import TYPE_CHECKING

from mlx_ring.planning.plan import GIB

if TYPE_CHECKING:
    from mlx_ring.planning.capabilities import Capabilities
    from mlx_ring.planning.plan import ModelSpec

CHUNK = 512  # prompt tokens per prefill step where PREFILL_CHUNK is auto: the most any device takes
SCORE_BYTES = 4  # attention computed unfused (a CPU always) keeps its scores and softmax in float32
# On CUDA a prefill chunk attends unfused only over at most this many keys:
# models/compat.py's UNFUSED_PREFILL_KEYS, which says why (kept apart so planning reads no
# MLX; a test holds them equal).
UNFUSED_KEYS = 2048
# A CUDA rank's prefill steps may hold this share of the memory its plan leaves beside weights and
# the KV_TOKENS reserve: big enough for several prompts' chunks a step, the rest stays KV room.
CUDA_SHARE = 0.25
MOST_STEP_TOKENS = 16384  # mlx-lm's batch generator prefills at most 8 prompts x 2048 tokens a step


def holds_graph(cap: "Capabilities") -> bool:
    """Whether the device keeps a graph's intermediates until the whole graph has run, so every
    layer of a stage counts: a GPU through CUDA does (0.9-1.6 GiB for 16 layers of an 8B shape
    with 512-token chunks, measured on an H200); a CPU and Metal free each array once the next
    ones are made (a CPU's stage measured at about one layer's: docs/planning.md)."""
    return cap.device.startswith(("NVIDIA", "Tesla"))  # CUDA's device names


def metal(cap: "Capabilities") -> bool:
    """A Mac, probed (a recommended working set) or declared in hosts.json (an Apple
    device, or none named)."""
    return bool(cap.working_set_gb) or cap.device.startswith("Apple") or not cap.device


def step_tokens(
    model: "ModelSpec",
    cap: "Capabilities | None" = None,
    rank: int = 0,
    n: int = 0,
    context: int = 0,
) -> int:
    """Tokens of forward work rank `rank` (`n` layers, KV room for `context` tokens) holds
    intermediates for at once, as the plan counts them: a prefill chunk (`model.prefill_chunk`,
    or `CHUNK`) or a decode step of `model.max_active` rows, whichever is more. A CUDA device
    takes more where its memory allows: prefill steps of several prompts' chunks (rows x chunk),
    as many tokens as `CUDA_SHARE` of what the plan leaves it beside weights and caches holds, in
    whole chunks, at most `MOST_STEP_TOKENS`. Elsewhere a chunk's time bounds a step (Metal's
    watchdog; a CPU's seconds a chunk), not memory. The scheduler keeps the prefill chunks on the
    device at once (rows x tokens, over every prompt prefilled together) within this many tokens,
    so the figure holds for any burst of prompts."""
    chunk = model.prefill_chunk or CHUNK
    least = max(chunk, model.max_active)
    if cap is None or not holds_graph(cap):
        return least
    weights = n * (model.layer_bytes + context * model.kv_bytes_per_token) + (
        model.ends_bytes if rank == 0 else 0
    )
    rest = cap.usable_gb * GIB - weights - _head_bytes(model, rank)
    per_token = n * model.act_bytes_per_token + _score_bytes(model, cap, n, context)
    fits = int(CUDA_SHARE * rest / per_token) // chunk * chunk if per_token > 0 and rest > 0 else 0
    return max(least, min(fits, MOST_STEP_TOKENS))


def activation_bytes(
    model: "ModelSpec", cap: "Capabilities", rank: int, n: int, context: int, tokens: int = 0
) -> float:
    """The bytes of intermediate arrays rank `rank` holds at its peak with `n` layers: `tokens`
    (else `step_tokens`) through every layer where the device holds a graph's intermediates (else
    one); off Metal, one layer's attention scores for those tokens against `context` keys (at
    most the model's context; on CUDA at most `UNFUSED_KEYS`, past which attention is fused); on
    rank 0 the head's float32 logits of every row, with their softmax."""
    tokens = tokens or step_tokens(model, cap, rank, n, context)
    held = n if holds_graph(cap) else min(n, 1)
    scores = tokens * _score_bytes(model, cap, n, context)
    return held * tokens * model.act_bytes_per_token + scores + _head_bytes(model, rank)


def _score_bytes(model: "ModelSpec", cap: "Capabilities", n: int, context: int) -> float:
    """One layer's attention scores and softmax for one query token, where
    attention may run unfused."""
    # Metal attends in one fused kernel; elsewhere a prompt's may run unfused (a CPU's always)
    if not n or metal(cap):
        return 0.0
    # no prompt is longer than the model's context
    keys = min(context, model.context_length or context)
    if holds_graph(cap):
        keys = min(keys, UNFUSED_KEYS)
    return 2 * model.heads * keys * SCORE_BYTES


def _head_bytes(model: "ModelSpec", rank: int) -> float:
    # the logits and their softmax
    return 2 * model.max_active * model.vocab * 4 if rank == 0 else 0.0


def prefill_step(
    model: "ModelSpec", caps: list["Capabilities"], layers: list[int], context: int, chunk: int
) -> int:
    """Prompt tokens of one prefill step on a ring whose rank r holds `layers[r]` layers
    (`caps[r]`): where every rank is a CUDA device, the fewest any rank's `step_tokens` grants
    (several prompts' `chunk`-token chunks at once); else one chunk, since a Mac's watchdog and a
    CPU's seconds bound a step by its time."""
    if not all(map(holds_graph, caps)):
        return chunk
    return max(chunk, least_step_tokens(model, caps, layers, context))


def least_step_tokens(
    model: "ModelSpec", caps: list["Capabilities"], layers: list[int], context: int
) -> int:
    """The fewest `step_tokens` any rank of the ring (rank r: `caps[r]`,
    `layers[r]` layers) holds."""
    return min(step_tokens(model, c, r, n, context) for r, (c, n) in enumerate(zip(caps, layers)))
