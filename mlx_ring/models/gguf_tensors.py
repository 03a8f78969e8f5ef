"""A GGUF file's tensors as MLX arrays, at MLX's own quantization.

Files whose tensors MLX reads itself (F32, F16, Q4_0, Q4_1, Q8_0) keep their blocks exactly as
MLX's quantization (`mx.load`); any other file (K-quants: Q4_K_M, Q5_K_M, Q6_K...) is read
tensor by tensor with `gguf.quants.dequantize` and stored as MLX's own quantization
(`MLX_BITS`): exactly where the type is MLX's affine form over 32 values (value = scale * q +
bias), requantized where it is not.
"""

from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize
from tqdm import tqdm

GROUP_SIZE = 32
# Not Q4_K or Q6_K: mx.load reads them as float16, and Q4_K wrongly (its gguflib decodes every odd
# 32-value sub-block with the scale of the one before, as upstream gguf-tools did).
MLX_READS = {T.F32, T.F16, T.Q4_0, T.Q4_1, T.Q8_0}
# Tensor types read -> the MLX bits (group size 32) they are stored at; None: kept as floats. At
# least the type's own bits, so storing adds little or nothing to the error the file already has.
MLX_BITS = {
    T.F32: None,
    T.F16: None,
    T.BF16: None,
    T.Q4_0: 4,
    T.Q4_1: 4,
    T.Q4_K: 4,
    T.Q5_0: 5,
    T.Q5_1: 5,
    T.Q5_K: 5,
    T.Q6_K: 8,
    T.Q8_0: 8,
}
# Types whose 32-value sub-blocks are exactly MLX's affine groups -> the bytes of a block
# holding the quantized values, as (start, end, byte for q = 0, byte for q = 1). Blocks with
# these bytes filled and dequantized by gguf give each group's bias and bias + scale, so no
# layout of scales is rewritten here.
_AFFINE = {
    T.Q4_0: [(2, 18, 0x00, 0x11)],
    T.Q4_1: [(4, 20, 0x00, 0x11)],
    T.Q5_0: [(2, 6, 0, 0), (6, 22, 0x00, 0x11)],
    T.Q5_1: [(4, 8, 0, 0), (8, 24, 0x00, 0x11)],
    T.Q8_0: [(2, 34, 0x80, 0x81)],  # int8 values: -128 is q = 0
    T.Q4_K: [(16, 144, 0x00, 0x11)],
    T.Q5_K: [(16, 48, 0, 0), (48, 176, 0x00, 0x11)],
}


def read_tensors(path: Path, tensors: list, to_float32: bool) -> dict:
    """The file's tensors as `mx.load` names them (`.weight`, `.scales`, `.biases`): MLX's own
    reader where it reads every type, else through the gguf package, at the bits MLX_BITS says
    (exactly for _AFFINE types)."""
    if all(t.tensor_type in MLX_READS for t in tensors):
        return mx.load(str(path))
    out = {}
    for t in tqdm(tensors, desc=f"reading {path.name}", unit="tensor", disable=None, leave=False):
        bits, cols, stem = MLX_BITS[t.tensor_type], int(t.shape[0]), t.name.removesuffix(".weight")
        if to_float32 or bits is None or len(t.shape) != 2 or cols % GROUP_SIZE or stem == t.name:
            w = mx.array(dequantize(t.data, t.tensor_type).astype(np.float32))  # rows by columns
            floats = {T.F16: mx.float16, T.BF16: mx.bfloat16}
            new = {t.name: w if to_float32 else w.astype(floats.get(t.tensor_type, mx.float32))}
        else:
            # a few float copies of 4M values at a time, not of a whole embedding
            rows = max(1, 2**22 // cols)
            parts = [
                _to_mlx_quantized(t.data[i : i + rows], t.tensor_type, bits)
                for i in range(0, len(t.data), rows)
            ]
            q, scales, biases = (mx.concatenate(p) for p in zip(*parts))
            # float16 scales and biases, as GGUF's own blocks and mx.load's
            # quantized tensors have them
            new = {
                t.name: q,
                f"{stem}.scales": scales.astype(mx.float16),
                f"{stem}.biases": biases.astype(mx.float16),
            }
        mx.eval(list(new.values()))  # one by one, so the float copies are freed at once
        out.update(new)
    return out


def _to_mlx_quantized(data: np.ndarray, qtype: T, bits: int) -> tuple[mx.array, mx.array, mx.array]:
    if qtype not in _AFFINE:  # Q6_K: quantized again
        return mx.quantize(
            mx.array(dequantize(data, qtype).astype(np.float32)), group_size=GROUP_SIZE, bits=bits
        )
    return _lift(data, qtype, bits)


def _lift(data: np.ndarray, qtype: T, bits: int) -> tuple[mx.array, mx.array, mx.array]:
    # A tensor of an _AFFINE type as MLX's (packed values, scales, biases), without requantizing.
    def probe(which):
        filled = data.reshape(
            -1, data.shape[-1] // (size := GGML_QUANT_SIZES[qtype][1]), size
        ).copy()
        for start, end, *fill in _AFFINE[qtype]:
            filled[..., start:end] = fill[which]
        return dequantize(filled.reshape(data.shape), qtype).reshape(data.shape[0], -1, GROUP_SIZE)

    w = dequantize(data, qtype).reshape(data.shape[0], -1, GROUP_SIZE)
    bias = probe(0)[..., :1]
    scale = probe(1)[..., :1] - bias
    q = np.rint((w - bias) / np.where(scale == 0, 1, scale)).clip(0, 2**bits - 1).astype(np.uint32)
    # MLX packs a row's values as one little-endian bit stream into uint32 words, at any bit width
    stream = ((q.reshape(len(q), -1)[..., None] >> np.arange(bits, dtype=np.uint32)) & 1).astype(
        np.uint8
    )
    packed = np.packbits(stream.reshape(len(q), -1), axis=-1, bitorder="little").view(np.uint32)
    return mx.array(packed), mx.array(scale[..., 0]), mx.array(bias[..., 0])
