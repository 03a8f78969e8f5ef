"""The in-process app over HTTP, around the stand-in engine and the default model's tokenizer
(tests/unit/conftest.py)."""

import pytest
from apiutil import client


@pytest.fixture
def http(engine, served):
    with client(engine, served) as c:
        yield c
