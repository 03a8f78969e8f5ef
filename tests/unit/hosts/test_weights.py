"""Weight pieces: each rebuilds its tensors exactly, a different model gets a different id, and a
rank finds its own slice whatever else the cache holds."""

import json

import mlx.core as mx
import pytest
from ringutil import make_tiny_model

from mlx_ring.hosts.weights import build_manifest, manifest, missing_pieces, piece_bytes, pieces_for


def test_weight_pieces_rebuild_every_tensor_exactly(tmp_path):
    folder = make_tiny_model(tmp_path / "m", "llama", n_layers=3)
    weights = mx.load(str(folder / "model.safetensors"))
    w, scales, biases = mx.quantize(
        weights["model.layers.1.mlp.up_proj.weight"], group_size=32, bits=4
    )
    weights |= {
        "model.layers.1.mlp.up_proj.weight": w,
        "model.layers.1.mlp.up_proj.scales": scales.astype(mx.bfloat16),
        # uint32, bfloat16, float16 beside float32
        "model.layers.1.mlp.up_proj.biases": biases.astype(mx.float16),
    }
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    m = build_manifest(folder)
    assert sorted(m["pieces"]) == ["ends", "layer-00000", "layer-00001", "layer-00002"]
    original = mx.load(str(next(folder.glob("model*.safetensors"))))
    rebuilt = {}
    for name, piece in m["pieces"].items():
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(b"".join(piece_bytes(folder, piece)))
        assert path.stat().st_size == piece["size"]
        rebuilt |= mx.load(str(path))
    assert rebuilt.keys() == original.keys()
    assert all(
        rebuilt[k].dtype == original[k].dtype and mx.array_equal(rebuilt[k], original[k]).item()
        for k in original
    )
    assert sum(p["size"] for p in m["pieces"].values()) == pytest.approx(
        sum(v.nbytes for v in original.values()), rel=0.01
    )
    assert manifest(folder, tmp_path / "cache") == m  # cached, and the same
    assert pieces_for(range(1, 3), ends=False) == ["layer-00001", "layer-00002"]
    assert missing_pieces(folder, ["ends"]) == []  # an ordinary folder holds every piece


def test_a_different_model_gets_a_different_id(tmp_path):
    a = build_manifest(make_tiny_model(tmp_path / "a", "llama", n_layers=2, seed=1))
    b = build_manifest(make_tiny_model(tmp_path / "b", "llama", n_layers=2, seed=2))
    assert a["id"] != b["id"] and a["pieces"]["ends"]["size"] == b["pieces"]["ends"]["size"]


def test_a_rank_finds_its_own_slice_whatever_else_the_cache_holds(tmp_path):
    from mlx_ring.hosts.weights import MANIFEST, find_slice, slice_folder

    def hosted(needed, model="m1"):
        folder = tmp_path / "hosted" / slice_folder(model, needed)
        folder.mkdir(parents=True)
        (folder / MANIFEST).write_text(json.dumps({"id": model, "present": needed}))
        return folder

    stale = hosted(pieces_for(range(12, 30), False))  # another rank's slice, once held here
    # two ranks on one host
    both = hosted(pieces_for(range(0, 12), True) + pieces_for(range(12, 20), False))
    hosted(pieces_for(range(0, 30), True), model="m2")  # another model
    assert (
        slice_folder("m1", ["a", "b"])
        == slice_folder("m1", ["b", "a"])
        != slice_folder("m1", ["a"])
    )
    assert find_slice(tmp_path, "m1", pieces_for(range(0, 12), True)) == both
    assert find_slice(tmp_path, "m1", pieces_for(range(20, 30), False)) == stale
    assert (
        find_slice(tmp_path, "m1", pieces_for(range(0, 4), True) + pieces_for(range(25, 30), False))
        is None
    )
    # none holds it all: resolve it
    assert find_slice(tmp_path, "m1", pieces_for(range(0, 30), True)) is None
