"""The layer plan: which contiguous, half-open range of decoder layers each rank holds, and why.

Pure data and pure functions, no MLX: every rank computes the same plan from the same inputs
(the model's sizes, every rank's capabilities, the strategy), so the plan itself never crosses
the ring. What a slice costs is `cost.py`; each strategy's layer counts, checked against
memory, `strategies.py`. Memory is counted in GiB (2**30 bytes, as Apple counts RAM),
bandwidth in 10**9 bytes/s.
"""

import math
from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class LayerPlan:
    """`ranges[s] = (start, end)`: stage s runs layers [start, end); together they cover [0,
    n_layers). `tensor` ranks hold each stage, each a 1/`tensor` share of every one of its layers
    (heads, MLP columns, experts), joined by all_sums: rank r is in stage `r // tensor`. A
    pipeline has `tensor == 1` (a stage a rank); tensor mode one stage of every rank."""

    n_layers: int
    ranges: tuple[tuple[int, int], ...]
    strategy: str = "uniform"
    tensor: int = 1

    def __post_init__(self):
        assert self.ranges and self.ranges[0][0] == 0 and self.ranges[-1][1] == self.n_layers, self
        assert all(a[1] == b[0] for a, b in zip(self.ranges, self.ranges[1:])), self
        assert all(s < e for s, e in self.ranges), self
        assert self.tensor >= 1, self

    @property
    def mode(self) -> str:
        return "tensor" if self.tensor > 1 else "pipeline"

    @property
    def size(self) -> int:
        """Ranks in the ring."""
        return len(self.ranges) * self.tensor

    @property
    def sizes(self) -> list[int]:
        """Layers of each stage."""
        return [e - s for s, e in self.ranges]

    def stage_of(self, rank: int) -> int:
        return rank // self.tensor

    def layers_of(self, rank: int) -> range:
        return range(*self.ranges[self.stage_of(rank)])

    def describe(self, hosts: list[str] | None = None) -> str:
        """One line per rank, e.g. `rank 0 (mac-a): layers [0, 15)  15 layers` (in tensor mode
        `... 30 layers, a 1/2 share of each`)."""
        lines = []
        for r in range(self.size):
            s, e = self.ranges[self.stage_of(r)]
            host = f" ({hosts[r]})" if hosts else ""
            share = f", a 1/{self.tensor} share of each" if self.tensor > 1 else ""
            lines.append(f"rank {r}{host}: layers [{s}, {e})  {e - s} layers{share}")
        return "\n".join(lines)


@dataclass(frozen=True)
class ModelSpec:
    """What the planner needs to know of a model: the size of one layer and of the two ends."""

    n_layers: int
    layer_bytes: float  # parameter bytes of one decoder layer (mean over the layers)
    ends_bytes: float  # embedding + final norm + head (once if tied): rank 0 holds them
    # bytes the head reads per decoded token (the head, or the tied embedding)
    head_read_bytes: float
    kv_bytes_per_token: float  # KV cache bytes of one attention layer for one token
    # bytes one layer reads per decoded token (MoE: only the active experts)
    layer_read_bytes: float
    layer_flops: float  # FLOPs of one layer per token (2 per active parameter)
    head_flops: float = 0.0
    dtype: str = "float16"
    name: str = ""
    hidden_bytes: float = 0.0  # one token's hidden state as it crosses a hop between ranks
    # The kinds of cache the layers keep (from the caches mlx-lm makes for them): the share
    # that keeps at most a sliding window of `kv_window` tokens, the share that keeps a
    # fixed state of `state_bytes` (a convolution's or an SSM's, one sequence's) instead;
    # the rest keep every token.
    kv_window_share: float = 0.0
    kv_window: int = 0
    state_share: float = 0.0
    state_bytes: float = 0.0
    # The arrays one layer's forward pass makes per token (activations.py counts them), the query
    # heads, the vocabulary, the longest prompt (0: any); and the serving settings they are held for
    # (0: PREFILL_CHUNK auto).
    act_bytes_per_token: float = 0.0
    heads: int = 0
    vocab: int = 0
    context_length: int = 0
    prefill_chunk: int = 0
    max_active: int = 1

    @property
    def total_bytes(self) -> float:
        return self.n_layers * self.layer_bytes + self.ends_bytes


def uniform_plan(n_layers: int, n_ranks: int) -> LayerPlan:
    """Split `n_layers` as evenly as possible; the first `n_layers % n_ranks` ranks get one more."""
    if n_ranks < 1:
        raise ValueError(f"need at least one rank, got {n_ranks}")
    if n_layers < n_ranks:
        raise ValueError(
            f"the model has {n_layers} layers but the hostfile names {n_ranks} ranks; "
            "every rank needs at least one layer: remove hosts or pick a deeper model"
        )
    base, extra = divmod(n_layers, n_ranks)
    return plan_from_sizes(
        n_layers, [base + (1 if r < extra else 0) for r in range(n_ranks)], "uniform"
    )


def tensor_plan(n_layers: int, n_ranks: int, strategy: str = "uniform") -> LayerPlan:
    """Tensor mode: one stage of all `n_layers`, every rank a 1/`n_ranks` share of each layer."""
    if n_ranks < 1:
        raise ValueError(f"need at least one rank, got {n_ranks}")
    return LayerPlan(n_layers, ((0, n_layers),), strategy, tensor=n_ranks)


def plan_from_sizes(n_layers: int, sizes: list[int], strategy: str = "custom") -> LayerPlan:
    """A plan from explicit per-rank layer counts (e.g. `LAYERS=3,2,2`), checked."""
    if sum(sizes) != n_layers or any(s < 1 for s in sizes):
        raise ValueError(
            (
                f"layer counts {list(sizes)} must be positive and add up to the "
                f"model's {n_layers} layers"
            )
        )
    ranges, start = [], 0
    for s in sizes:
        ranges.append((start, start + s))
        start += s
    return LayerPlan(n_layers, tuple(ranges), strategy)


def proportional_sizes(n_layers: int, weights: list[float]) -> list[int]:
    """Layer counts proportional to `weights`, each at least 1 (largest remainder;
    ties to low ranks)."""
    n = len(weights)
    if n_layers < n:
        uniform_plan(n_layers, n)  # raises the usual message
    total = sum(weights)
    if total <= 0 or any(w < 0 for w in weights):
        weights, total = [1.0] * n, float(n)
    quota = [n_layers * w / total for w in weights]
    sizes = [max(1, math.floor(q)) for q in quota]
    # the minimum of one layer each overshot: take from the most over quota
    while sum(sizes) > n_layers:
        r = max((r for r in range(n) if sizes[r] > 1), key=lambda r: (sizes[r] - quota[r], -r))
        sizes[r] -= 1
    while sum(sizes) < n_layers:
        r = max(range(n), key=lambda r: (quota[r] - sizes[r], -r))
        sizes[r] += 1
    return sizes
