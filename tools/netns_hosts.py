"""The test hosts (tests/testhosts.py), for the tools that run on them (bench_links.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from testhosts import NetnsHosts, sh, why_not  # noqa: E402, F401
