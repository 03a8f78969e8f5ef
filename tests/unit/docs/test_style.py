"""The code keeps one style: ruff's lint (its default rules, import order, lines of at most 100
characters, as pyproject.toml sets them) and its formatter find nothing to change anywhere."""

import subprocess
import sys

from mlx_ring.config import ROOT


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True
    )


def test_ruff_finds_nothing_to_fix():
    p = ruff("check", "--no-cache", ".")
    assert p.returncode == 0, f"run `.venv/bin/ruff check --fix .`:\n{p.stdout[-3000:]}"


def test_the_code_is_as_ruff_formats_it():
    p = ruff("format", "--check", "--no-cache", ".")
    assert p.returncode == 0, f"run `.venv/bin/ruff format .`:\n{p.stdout[-3000:]}"
