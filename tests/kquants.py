"""K-quant blocks (Q4_K, Q5_K, Q6_K) made with numpy, following llama.cpp's block layouts.

The gguf package dequantizes K-quants but cannot make them, so the tests' GGUF files get their
blocks here; `gguf.quants.dequantize` reading them back is the check that the layout is right.
Scales are fitted simply (each sub-block's own range), not with llama.cpp's search: the blocks are
valid, only a little less accurate than llama.cpp's.
"""

import numpy as np
from gguf import GGMLQuantizationType as T

QK_K = 256


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _scales_mins(x: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    # x: (blocks, 8, 32). Per sub-block an affine fit, its scale and min then quantized to 6 bits
    # against the block's d and dmin, as Q4_K and Q5_K store them.
    lo = np.minimum(x.min(-1), 0)
    scale = (x.max(-1) - lo) / levels
    d = scale.max(-1) / 63
    dmin = (-lo).max(-1) / 63
    d16, dmin16 = (
        d.astype(np.float16).astype(np.float32),
        dmin.astype(np.float16).astype(np.float32),
    )
    sc = np.clip(np.round(scale / np.where(d16 > 0, d16, 1)[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.round(-lo / np.where(dmin16 > 0, dmin16, 1)[:, None]), 0, 63).astype(np.uint8)
    eff_scale = (d16[:, None] * sc)[..., None]
    eff_min = (dmin16[:, None] * m)[..., None]
    q = np.clip(np.round((x + eff_min) / np.where(eff_scale > 0, eff_scale, 1)), 0, levels).astype(
        np.uint8
    )
    # 12 bytes: the low 6 bits of scales and mins 0-3, then 4-7 split over the top bits
    # and a last row.
    packed = np.concatenate(
        [
            sc[:, :4] | ((sc[:, 4:] >> 4) << 6),
            m[:, :4] | ((m[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4),
        ],
        axis=-1,
    )
    return _f16_bytes(d), _f16_bytes(dmin), packed, q


def _low_nibbles(q: np.ndarray) -> np.ndarray:
    # (blocks, 8, 32) -> 128 bytes: sub-blocks 2c and 2c+1 share bytes
    # 32c..32c+31 (low, high nibble).
    low = q & 15
    return (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(len(q), -1)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    x = x.reshape(-1, 8, 32).astype(np.float32)
    d, dmin, scales, q = _scales_mins(x, 15)
    return np.concatenate([d, dmin, scales, _low_nibbles(q)], axis=-1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    x = x.reshape(-1, 8, 32).astype(np.float32)
    d, dmin, scales, q = _scales_mins(x, 31)
    # bit j: sub-block j
    qh = ((q >> 4) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(1).astype(np.uint8)
    return np.concatenate([d, dmin, scales, qh, _low_nibbles(q)], axis=-1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    x = x.reshape(-1, 16, 16).astype(np.float32)
    scale = np.abs(x).max(-1) / 31  # q - 32 in [-32, 31]
    d = scale.max(-1) / 127
    d16 = d.astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d16 > 0, d16, 1)[:, None]), 0, 127).astype(np.int8)
    eff = (d16[:, None] * sc)[..., None]
    q = (
        (np.clip(np.round(x / np.where(eff > 0, eff, 1)), -32, 31) + 32)
        .astype(np.uint8)
        .reshape(-1, 2, 2, 64)
    )
    ql = (q[:, :, 0] & 15) | ((q[:, :, 1] & 15) << 4)  # (blocks, 2, 64)
    high = (q >> 4).reshape(-1, 2, 4, 32)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    return np.concatenate(
        [ql.reshape(len(q), -1), qh.reshape(len(q), -1), sc.view(np.uint8), _f16_bytes(d)], axis=-1
    )


QUANTIZERS = {T.Q4_K: quantize_q4_k, T.Q5_K: quantize_q5_k, T.Q6_K: quantize_q6_k}


def quantize(w: np.ndarray, qtype: T) -> np.ndarray:
    """A float matrix (rows, columns; columns a multiple of 256) as its K-quant bytes, one row of
    blocks per row."""
    assert w.shape[-1] % QK_K == 0, "K-quants take rows of whole 256-value blocks"
    blocks = QUANTIZERS[qtype](w.reshape(-1, QK_K))
    return blocks.reshape(w.shape[0], -1)
