"""The test hosts (tests/testhosts.py), for the tools that run on them (bench_links.py)."""

from testhosts import NetnsHosts, sh, why_not  # noqa: F401
