"""The documentation site builds with `mkdocs build --strict` (issue 38): a broken link or anchor, a page missing
from the nav or a nav entry without its page, a docstring the API reference cannot render, each fails the build.
Offline: the theme loads no web fonts and no plugin fetches anything."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(tmp_path: Path, config: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(config),
            "-d",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_site_builds_strict(tmp_path):
    proc = build(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    site = tmp_path / "site"
    for page in ["guide/circuits", "reference/api", "REPRODUCTIONS"]:
        assert (site / page / "index.html").is_file(), page
    assert "Run.evaluate" in (site / "reference/api/index.html").read_text()  # rendered from the docstrings
    # Nothing fetched from the network when a page is read: no web fonts.
    assert not any("fonts.googleapis" in p.read_text() for p in site.rglob("*.html"))


def test_a_broken_link_fails_the_build(tmp_path):
    """The strict build is not lenient: the site's own config with one page linking nowhere fails."""
    docs = tmp_path / "docs"
    (docs / "guide").mkdir(parents=True)
    (docs / "index.md").write_text("# home\n\n[gone](guide/nosuch.md)\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        (ROOT / "mkdocs.yml").read_text().split("nav:")[0].replace("paths: [src]", f"paths: [{ROOT / 'src'}]")
        + "nav:\n  - Home: index.md\n"
    )
    proc = build(tmp_path, config)
    assert proc.returncode != 0
    assert "guide/nosuch.md" in proc.stderr
