import os
import sys
from pathlib import Path

import pytest

PYCACHE = Path(__file__).resolve().parent.parent / ".cache" / "pycache"


def pytest_configure(config):
    """Bytecode cached for every Python process the suite starts (hundreds: each rank, each
    launch.sh): under PYTHONDONTWRITEBYTECODE each would compile mlx-lm, transformers and the
    rest from source again, about 1.3 s of a core apiece. The cache is a folder of its own
    (.cache/pycache, ignored by git), so the source tree stays as clean as that setting keeps it."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    sys.dont_write_bytecode, sys.pycache_prefix = False, str(PYCACHE)


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The same cache launch.sh uses, so the default model is converted once per machine."""
    from mlx_ring.config import parse_config

    return parse_config([])[0].cache_dir


@pytest.fixture(scope="session")
def default_model(cache_dir) -> Path:
    from mlx_ring.models.source import resolve_model

    return resolve_model(None, cache_dir, "auto")


# the order groups start in when the suite runs on several workers
TIERS = ("hosts", "ring", "unit")
# Files that take minutes each (CI's --durations): started before the rest of their tier, so that
# the many short files fill in behind them and both workers end together, instead of one starting a
# 4-minute file when the other has nothing left.
LONGEST = ("tests/ring/test_model_matrix.py", "tests/ring/test_tensor_matrix.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """On several workers (`-n 2 --dist loadgroup --no-loadscope-reorder`, the default): a test
    file runs whole on one worker and in its order, since a module's ring is shared and some of
    its tests end it; the test hosts' files share one worker, as they make the same namespace
    hosts. Groups start in this order (xdist's own reorder, by number of tests, is off): the
    slowest first, so no worker is left with a long tail."""

    # The folder right under tests/: a tier's subject folders (tests/unit/hosts/)
    # belong to that tier.
    def tier(item):
        return next((t for t in TIERS if f"tests/{t}/" in item.nodeid), "unit")

    def file(item):
        return item.nodeid.split("::")[0]

    for item in items:
        group = "hosts" if tier(item) == "hosts" else file(item)
        item.add_marker(pytest.mark.xdist_group(group))

    def rank(item):
        return LONGEST.index(file(item)) if file(item) in LONGEST else len(LONGEST)

    # stable: each file keeps its order
    items.sort(key=lambda item: (TIERS.index(tier(item)), rank(item)))
