"""How a decode group's KV cache grows: the one rule that the ranks apply to their caches (shard.py)
and that rank 0 counts room by (serving/rows.py)."""

# A decode group's cache grows by this many token-rows at a time: mlx-lm's fixed 256 tokens a row
# leaves a wide group holding many times the tokens it has, and growing copies the whole cache.
GROUP_SPARE_TOKENS = 256


def growth_step(rows: int, spare: int = GROUP_SPARE_TOKENS) -> int:
    """Tokens each of a group's `rows` grows by at a time: few rows grow in mlx-lm's steps of 256
    tokens (fewer copies), many rows in smaller ones, never under 16."""
    return max(16, spare // rows)
