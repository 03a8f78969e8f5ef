"""Each GGUF tensor type as a file holds it: K-quant blocks (Q4_K, Q5_K, Q6_K, from
tests/kquants.py) read back by gguf's own dequantization within a step, and every type read as
float32 exactly and kept as the table says (MLX's quantization or a float type)."""

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.quants import dequantize, quantize
from ggufutil import _encode
from kquants import quantize as quantize_k

import mlx_ring.models.gguf_convert as gc
import mlx_ring.models.gguf_tensors as gt


@pytest.mark.parametrize("qtype,levels", [(T.Q4_K, 15), (T.Q5_K, 31), (T.Q6_K, 63)])
def test_kquant_blocks_read_back_within_a_step(qtype, levels):
    rng = np.random.default_rng(0)
    w = (rng.normal(size=(6, 512)) * 0.05).astype(np.float32)
    back = dequantize(quantize_k(w, qtype), qtype)
    # Every value within one quantization step of its sub-block (32 values; 16 for Q6_K, symmetric).
    sub = w.reshape(-1, 16 if qtype == T.Q6_K else 32)
    step = (
        2 * np.abs(sub).max(-1) if qtype == T.Q6_K else sub.max(-1) - np.minimum(sub.min(-1), 0)
    ) / levels
    assert (np.abs(back - w).reshape(sub.shape) <= step[:, None]).all()
    # a half step on average, as rounding gives
    assert np.abs(back - w).mean() < 0.6 * step.mean() / 2 + 1e-6


def test_each_tensor_type_is_stored_as_the_table_says(tmp_path):
    rng = np.random.default_rng(2)
    w = (rng.normal(size=(8, 256)) * 0.05).astype(np.float32)
    types = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]
    writer = GGUFWriter(str(tmp_path / "all.gguf"), "llama")
    held = {}
    for t in types:
        data = _encode(w, t) if t != T.BF16 else quantize(w, T.BF16)
        writer.add_tensor(
            f"{t.name}.weight",
            data,
            raw_dtype=t if t == T.BF16 else None if t in (T.F32, T.F16) else t,
        )
        held[t] = dequantize(data, t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _, tensors = gc.read_header(tmp_path / "all.gguf")
    kept = gt.read_tensors(tmp_path / "all.gguf", tensors, to_float32=False)
    f32 = gt.read_tensors(tmp_path / "all.gguf", tensors, to_float32=True)
    for t in types:
        name, bits = t.name, gt.MLX_BITS[t]
        np.testing.assert_array_equal(np.array(f32[f"{name}.weight"]), held[t], err_msg=name)
        if bits is None:
            assert (
                kept[f"{name}.weight"].dtype
                == {T.F32: mx.float32, T.F16: mx.float16, T.BF16: mx.bfloat16}[t]
            )
            got = kept[f"{name}.weight"].astype(mx.float32)
        else:
            scales, biases = kept[f"{name}.scales"], kept[f"{name}.biases"]
            assert scales.dtype == mx.float16 and scales.shape == (8, 256 // 32)
            got = mx.dequantize(
                kept[f"{name}.weight"],
                scales.astype(mx.float32),
                biases.astype(mx.float32),
                group_size=32,
                bits=bits,
            )
        err = np.abs(np.array(got) - held[t]).max()
        # Exact but for float16 scales and offsets: |scale * q| <= 2 max|w| and |offset| <= max|w|,
        # each within 2^-11 of itself, so within 1.5 * 2^-10 max|w|. Q6_K is requantized at 8 bits:
        # a step of 2 max / 255 against its own of max / 31, so with the float16 rounding under half
        # its own error (0.30 here).
        limit = 0.5 * np.abs(held[t] - w).max() if t == T.Q6_K else 2**-9 * np.abs(w).max()
        assert err <= limit, (name, err, limit)
