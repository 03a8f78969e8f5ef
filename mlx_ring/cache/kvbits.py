"""KV_BITS: the prompt cache's blocks kept quantized, as mlx-lm's `QuantizedKVCache` keeps its KV:
`mx.quantize` over groups of a head's columns (64, mlx-lm's group, or 32 where 64 does not divide
them), each group's scale and bias in the KV's own dtype. held.py packs a block as it keeps it (its
RAM tier and its disk alike) and unpacks what a LOAD reads back into that dtype, on the engine
thread only. The live decode cache stays unquantized: mlx-lm's batched caches have no quantized
form, so a prompt restored from quantized blocks decodes over their dequantized values.
"""

from dataclasses import dataclass

import mlx.core as mx

BITS = (0, 8, 4)  # KV_BITS' choices; 0: blocks kept as the cache holds them
GROUPS = (64, 32)  # mlx-lm's group first; MLX quantizes in groups of 32, 64 or 128


def group_size(columns: tuple[int, ...]) -> int:
    """The group that divides every one of a layer's KV `columns` (a head's): 64, else 32;
    ValueError where neither does."""
    for g in GROUPS:
        if all(c % g == 0 for c in columns):
            return g
    raise ValueError(
        f"KV_BITS quantizes a head's KV columns ({', '.join(map(str, columns))} here) in groups "
        "of 64 or 32, and neither divides them; set KV_BITS=0 for this model"
    )


def head_columns(shape) -> tuple[int, ...]:
    """The columns a layer's cache holds per token and head (models/shape.ModelShape): a head's,
    or, for latent attention, its compressed vector and its rotary key."""
    if shape.kv_lora_rank:
        return tuple(c for c in (shape.kv_lora_rank, shape.rope_head_dim) if c)
    return (shape.head_dim,)


@dataclass(frozen=True)
class KVBits:
    """How a rank keeps its blocks: `bits` per value (0: unquantized) in groups of `group`."""

    bits: int = 0
    group: int = 64

    def __post_init__(self):
        assert self.bits in BITS and self.group in GROUPS, self

    def tag(self) -> str:
        """What the keys' salt adds (cache/tiers.salt): nothing for unquantized blocks, so blocks
        kept before KV_BITS existed still match."""
        return f":kv{self.bits}g{self.group}" if self.bits else ""

    def pack(self, layers: list[tuple[mx.array, ...]]) -> list[tuple[mx.array, ...]]:
        """Each layer's (keys, values) as keys' (packed, scales, biases), then values'."""
        if not self.bits:
            return layers
        return [
            tuple(q for a in kv for q in mx.quantize(a, group_size=self.group, bits=self.bits))
            for kv in layers
        ]

    def unpack(self, layers: list[tuple[mx.array, ...]]) -> list[tuple[mx.array, ...]]:
        """`pack`'s arrays back as each layer's (keys, values), in the dtype they were made in
        (that of the scales)."""
        if not self.bits:
            return layers
        return [
            tuple(
                mx.dequantize(*kv[i : i + 3], group_size=self.group, bits=self.bits)
                for i in range(0, len(kv), 3)
            )
            for kv in layers
        ]

    def share(self, itemsize: int) -> float:
        """A packed block's bytes per byte of the unpacked, whose values take `itemsize` bytes:
        `bits` per value, and a scale and a bias per group."""
        if not self.bits:
            return 1.0
        return (self.bits / 8 + 2 * itemsize / self.group) / itemsize


OFF = KVBits()


def for_model(bits: int, shape) -> KVBits:
    """KV_BITS for the model of `shape`; ValueError where its heads fit no group."""
    if not bits:
        return OFF
    return KVBits(bits, group_size(head_columns(shape)))
