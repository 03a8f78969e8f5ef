"""The layer plan: which contiguous, half-open range of decoder layers each rank holds.

Pure data and pure functions, no MLX: every rank computes the same plan from the same inputs.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerPlan:
    """`ranges[r] = (start, end)`: rank r runs layers [start, end); together they cover [0, n_layers)."""

    n_layers: int
    ranges: tuple[tuple[int, int], ...]
    strategy: str = "uniform"

    def __post_init__(self):
        assert self.ranges and self.ranges[0][0] == 0 and self.ranges[-1][1] == self.n_layers, self
        assert all(a[1] == b[0] for a, b in zip(self.ranges, self.ranges[1:])), self
        assert all(s < e for s, e in self.ranges), self

    @property
    def size(self) -> int:
        return len(self.ranges)

    def layers_of(self, rank: int) -> range:
        return range(*self.ranges[rank])

    def describe(self, hosts: list[str] | None = None) -> str:
        """One line per rank, e.g. `rank 0 (mac-a): layers [0, 15)  15 layers`."""
        lines = []
        for r, (s, e) in enumerate(self.ranges):
            host = f" ({hosts[r]})" if hosts else ""
            lines.append(f"rank {r}{host}: layers [{s}, {e})  {e - s} layers")
        return "\n".join(lines)


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
    ranges, start = [], 0
    for r in range(n_ranks):
        end = start + base + (1 if r < extra else 0)
        ranges.append((start, end))
        start = end
    return LayerPlan(n_layers, tuple(ranges), "uniform")


def plan_from_sizes(n_layers: int, sizes: list[int]) -> LayerPlan:
    """A plan from explicit per-rank layer counts (e.g. `LAYERS=3,2,2`), checked."""
    if sum(sizes) != n_layers or any(s < 1 for s in sizes):
        raise ValueError(f"layer counts {sizes} must be positive and add up to the model's {n_layers} layers")
    ranges, start = [], 0
    for s in sizes:
        ranges.append((start, start + s))
        start += s
    return LayerPlan(n_layers, tuple(ranges), "custom")
