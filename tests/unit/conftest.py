"""The in-process API tests' model and engine: the default model's real tokenizer (and the same
under a tools template), and a stand-in engine (tests/apiutil.py)."""

import pytest
from apiutil import FakeEngine, served_model
from mlx_lm.utils import load_tokenizer
from ringutil import tool_model


@pytest.fixture(scope="module")
def served(default_model):
    return served_model(default_model, load_tokenizer(default_model))


@pytest.fixture(scope="module")
def tool_served(default_model, tmp_path_factory):
    model = tool_model(tmp_path_factory.mktemp("tools") / "model", default_model)
    return served_model(model, load_tokenizer(model))


@pytest.fixture
def engine(served):
    return FakeEngine(served.tokenizer)
