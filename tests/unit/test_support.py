"""Model types: the supported ones load, any other is refused before a request can reach it."""

import json

import pytest
from ringutil import ROOT, make_tiny_model

from mlx_ring.models.support import SUPPORTED, table
from mlx_ring.planning.plan import uniform_plan
from shard import load_shard


def test_an_unsupported_type_is_refused_in_one_sentence_naming_the_supported(tmp_path):
    model = make_tiny_model(tmp_path / "m", "llama")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "falcon_h1"}))  # a hybrid mlx-lm runs
    with pytest.raises(ValueError) as e:
        load_shard(model, uniform_plan(7, 1), 0)
    assert str(e.value).startswith("model type 'falcon_h1' is not supported") and ", ".join(SUPPORTED) in str(e.value)


def test_the_models_page_lists_the_supported_types():
    assert table() in (ROOT / "docs" / "models.md").read_text()
