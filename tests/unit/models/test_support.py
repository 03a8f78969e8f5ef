"""Model types: the admitted ones load, any other is refused before a request can reach it, with the
reason the model matrix found; the docs' table is the matrix's record."""

import json

import pytest
from ringutil import ROOT, make_tiny_model

from mlx_ring.models import support
from mlx_ring.planning.plan import uniform_plan
from shard import load_shard


def _with_type(tmp_path, kind):
    model = make_tiny_model(tmp_path / "m", "llama")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": kind}))
    return model


def test_a_refused_type_is_refused_with_the_reason_its_run_found(tmp_path):
    kind, reason = next(iter(support.REFUSED.items()))
    with pytest.raises(ValueError) as e:
        load_shard(_with_type(tmp_path, kind), uniform_plan(7, 1), 0)
    assert str(e.value).startswith(
        f"model type {kind!r} is not supported: its test split across ranks fails: {reason}"
    )
    assert "docs/models.md" in str(e.value)


def test_a_type_mlx_lm_does_not_know_is_refused(tmp_path):
    with pytest.raises(
        ValueError,
        match="model type 'no_such_model' is not supported: mlx-lm 0.32.2 has no such type",
    ):
        load_shard(_with_type(tmp_path, "no_such_model"), uniform_plan(7, 1), 0)


def test_every_type_is_either_admitted_or_refused_and_the_docs_hold_the_table():
    from model_zoo import text_decoder_types

    assert sorted({**support.SUPPORTED, **support.REFUSED}) == text_decoder_types()
    assert not set(support.SUPPORTED) & set(support.REFUSED)
    docs = (ROOT / "docs" / "models.md").read_text()
    assert docs.count(support.table()) == 1 and support.summary() in docs
    assert "docs/models.md" in (ROOT / "README.md").read_text()


def test_a_variant_the_matrix_does_not_test_is_refused():
    """Gemma 4 E2B/E4B: per-layer inputs made from token ids would be wrong on every
    rank after the first."""
    with pytest.raises(
        ValueError, match="'gemma4' is supported, but not with hidden_size_per_layer_input set"
    ):
        support.check_supported(
            {"model_type": "gemma4", "text_config": {"hidden_size_per_layer_input": 256}}
        )
    support.check_supported(
        {"model_type": "gemma4", "text_config": {"hidden_size_per_layer_input": 0}}
    )
