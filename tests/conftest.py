from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The same cache launch.sh uses, so the default model is converted once per machine."""
    from mlx_ring.config import parse_config

    return parse_config([])[0].cache_dir


@pytest.fixture(scope="session")
def default_model(cache_dir) -> Path:
    from mlx_ring.models.source import resolve_model

    return resolve_model(None, cache_dir, "auto")
