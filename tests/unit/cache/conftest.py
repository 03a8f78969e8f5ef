"""The prompt cache's tests' fixtures."""

import shutil
import threading
from types import SimpleNamespace

import pytest

from mlx_ring.cache import disk


@pytest.fixture
def held_writer(monkeypatch):
    """The writer waits before each block (at its free-space check) until `go` is set; `at` is
    set once it waits there."""
    held, usage = SimpleNamespace(go=threading.Event(), at=threading.Event()), shutil.disk_usage

    def waiting(where):
        held.at.set()
        assert held.go.wait(60), "the test never let the writer go"
        return usage(where)

    monkeypatch.setattr(disk.shutil, "disk_usage", waiting)
    yield held
    held.go.set()
