"""Where a decode step's time goes, rank by rank (mlx_ring/ring/timeline.py), for bench_steps.py."""

from mlx_ring.ring.timeline import between_pings, decode_times, steps, summary  # noqa: F401
