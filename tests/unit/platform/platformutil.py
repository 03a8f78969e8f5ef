"""The recorded macOS outputs the platform tests parse (tests/data/macos/README.md names their
sources), and the mark of a test that reads Linux's /proc."""

import sys
from pathlib import Path

import pytest

MAC = Path(__file__).resolve().parents[2] / "data" / "macos"
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")


def rec(name: str) -> str:
    return (MAC / name).read_text()
