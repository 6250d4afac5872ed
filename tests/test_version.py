"""The version the package reports is pyproject.toml's (issue 38), read from the installed metadata."""

import re
from pathlib import Path

import headcount

ROOT = Path(__file__).resolve().parents[1]


def test_version_is_pyprojects():
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE).group(1)
    assert headcount.__version__ == declared


def test_changelog_names_the_version():
    assert f"## {headcount.__version__}" in (ROOT / "CHANGELOG.md").read_text()
