"""KV_BITS: the prompt cache's blocks kept quantized, as mlx-lm's `QuantizedKVCache` keeps its KV:
`mx.quantize` over groups of a head's columns (64, mlx-lm's group, or 32 where 64 does not divide
them), each group's scale and bias in the KV's own dtype. held.py packs a block as it keeps it (its
RAM tier and its disk alike) and unpacks what a LOAD reads back into that dtype, on the engine
thread only. The live decode cache stays unquantized: mlx-lm's batched caches have no quantized
form, so a prompt restored from quantized blocks decodes over their dequantized values.
"""

from dataclasses import dataclass

import mlx.core as mx

from mlx_ring.cache_sizes import GROUPS, group_size, head_columns, packed_share

BITS = (0, 8, 4)  # KV_BITS' choices; 0: blocks kept as the cache holds them


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
        return packed_share(self.bits, self.group, itemsize)


OFF = KVBits()


def for_model(bits: int, shape) -> KVBits:
    """KV_BITS for the model of `shape`; ValueError where its heads fit no group."""
    if not bits:
        return OFF
    return KVBits(bits, group_size(head_columns(shape)))
