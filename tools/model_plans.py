"""Dry-run plans of the big models on a few Mac rings, from their published config.json alone (no
weights): which precision fits each ring, with how many layers per Mac, and the memory left.

    python -m tools.model_plans            # the markdown table docs/models.md holds

The configs are tests/data/configs/*.json; sizes come from the tensors mlx-lm builds for each config
(`mlx_ring.planning.sizes`), so experts, shared experts and latent attention count as they are.
"""

import json
from pathlib import Path

from mlx_ring.planning.capabilities import Capabilities, default_usable_gb
from mlx_ring.planning.cost import memory_need
from mlx_ring.planning.plan import GIB
from mlx_ring.planning.sizes import spec_from_config
from mlx_ring.planning.strategies import plan_layers

CONFIGS = Path(__file__).resolve().parent.parent / "tests" / "data" / "configs"
# (name, Macs, memory GiB, bf16 TFLOP/s, memory GB/s): an M3 Ultra, an M4 Max and an M4 Pro.
RINGS = [
    ("2 x 192 GB (M3 Ultra)", 2, 192, 28.0, 800.0),
    ("4 x 128 GB (M4 Max)", 4, 128, 17.0, 546.0),
    ("3 x 64 GB (M4 Pro)", 3, 64, 9.0, 273.0),
]
PRECISIONS = [("bf16", None), ("8-bit", 8), ("4-bit", 4)]
KV_TOKENS = 8192


def ring(name: str, n: int, memory: float, tflops: float, bandwidth: float) -> list[Capabilities]:
    return [
        Capabilities(
            f"mac{i}", memory, default_usable_gb(memory), tflops, bandwidth, source="declared"
        )
        for i in range(n)
    ]


def plan_cell(spec, caps: list[Capabilities]) -> str:
    """`layers per Mac (fullest Mac's use)` where the model fits, else `no`."""
    try:
        plan = plan_layers(spec, caps, "balanced", KV_TOKENS)
    except ValueError:
        return "no"
    full = max(
        memory_need(spec, caps[r], r, e - s, KV_TOKENS) / GIB / caps[r].usable_gb
        for r, (s, e) in enumerate(plan.ranges)
    )
    return f"{'+'.join(map(str, plan.sizes))} ({full:.0%})"


def table() -> str:
    """A row per model: its size, and for each ring the lightest precision that
    fits, with its split."""
    head = ["model (`model_type`)", "parameters (active)"] + [r[0] for r in RINGS]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for f in sorted(CONFIGS.glob("*.json")):
        config = json.loads(f.read_text())
        spec = spec_from_config(config)
        total = (spec.n_layers * spec.layer_bytes + spec.ends_bytes) / 2e9
        active = (spec.n_layers * spec.layer_read_bytes + spec.ends_bytes) / 2e9
        specs = [
            (
                p,
                spec_from_config(
                    dict(config, quantization={"group_size": 64, "bits": bits}) if bits else config
                ),
            )
            for p, bits in PRECISIONS
        ]
        cells = []
        for r in RINGS:
            caps = ring(*r)
            fits = next(((p, cell) for p, s in specs if (cell := plan_cell(s, caps)) != "no"), None)
            cells.append(f"{fits[0]}: {fits[1]}" if fits else "does not fit at 4-bit")
        rows.append(
            f"| {f.stem} (`{config['model_type']}`) | {total:.0f}B ({active:.0f}B) | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
