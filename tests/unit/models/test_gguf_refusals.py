"""GGUF files refused from their header: an architecture or a tensor type that is not read is named
before any tensor is read, and nothing is left in the cache."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from ggufutil import _smollm2_vocab, _write_gguf

import mlx_ring.models.gguf_convert as gc
import mlx_ring.models.source as ms


def _refused(path, match):
    with pytest.raises(ValueError, match=match):
        ms.resolve_model(str(path), path.parent / "cache")
    assert not (path.parent / "cache").exists()


def test_an_architecture_not_read_is_named_before_anything_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(
        gc, "read_tensors", lambda *a, **k: pytest.fail("tensors were read before the refusal")
    )
    _write_gguf(
        tmp_path / "x.gguf",
        "rwkv7",
        {"token_embd.weight": (np.zeros((4, 32)), T.F32)},
        {"block_count": 1},
        _smollm2_vocab(),
    )
    _refused(
        tmp_path / "x.gguf",
        r"GGUF architecture 'rwkv7' is not supported; supported: llama, qwen2, qwen3, gemma3",
    )


def test_a_tensor_type_not_read_is_named_before_anything_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(
        gc, "read_tensors", lambda *a, **k: pytest.fail("tensors were read before the refusal")
    )
    writer = GGUFWriter(str(tmp_path / "iq.gguf"), "llama")
    # IQ2_XS: 74 bytes per 256 values; any bytes will do, as nothing may read them
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 74), np.uint8), raw_dtype=T.IQ2_XS)
    writer.add_tensor("output_norm.weight", np.ones(256, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _refused(tmp_path / "iq.gguf", r"tensor type IQ2_XS is not supported \(iq.gguf\).*Q4_K_M")
