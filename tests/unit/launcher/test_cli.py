"""`./launch.sh test`'s arguments: the whole suite, or with `quick` the in-process tier alone, and
the user's own pytest arguments passed on either way."""

import tomllib

from mlx_ring.config import ROOT
from mlx_ring.launcher.cli import QUICK, USAGE, pytest_argv


def test_the_test_command_runs_the_whole_suite_with_the_arguments_given():
    assert pytest_argv([]) == ["-m", "pytest"]
    page = "tests/ring/test_page.py"
    assert pytest_argv(["-q", page]) == ["-m", "pytest", "-q", page]


def test_quick_runs_the_in_process_tier_alone_with_the_arguments_after_it():
    assert pytest_argv(["quick"]) == ["-m", "pytest", "tests/unit"]
    assert pytest_argv(["quick", "-q", "-k", "plan"]) == ["-m", "pytest", QUICK, "-q", "-k", "plan"]
    # Only a first `quick` is the command's word; elsewhere it is pytest's (a -k expression here).
    assert pytest_argv(["-k", "quick"]) == ["-m", "pytest", "-k", "quick"]


def test_the_quick_tier_is_one_of_the_suites_folders_and_help_names_it():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    testpaths = pyproject["tool"]["pytest"]["ini_options"]["testpaths"]
    assert QUICK in testpaths and (ROOT / QUICK).is_dir()
    assert "test quick" in USAGE and QUICK in USAGE
