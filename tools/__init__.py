"""The maintained benches and tools (tools/README.md), run as programs; a package so that the
tests import the helpers they share with the tools (tools.random_model) by name."""
