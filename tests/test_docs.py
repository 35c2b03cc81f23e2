"""The documentation site builds with `mkdocs build --strict`: every page in the nav exists,
every link and anchor between pages resolves, every `[`jaxdae.X`][]` cross-reference in a
docstring names a documented object, and griffe reads every docstring without a warning."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]'")
pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed: pip install -e '.[docs]'")
pytest.importorskip("material", reason="mkdocs-material is not installed: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parent.parent


def build(config: Path, site_dir: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of `config` into `site_dir` (the command `make docs` runs)."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site_dir)],
        cwd=config.parent, env=env, capture_output=True, text=True, timeout=600,
    )


def test_site_builds_without_warnings(tmp_path):
    site = tmp_path / "site"
    result = build(ROOT / "mkdocs.yml", site)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{output}"
    assert "WARNING" not in output, output
    # The API reference is generated from the docstrings.
    formulations = (site / "api" / "formulations" / "index.html").read_text(encoding="utf-8")
    assert 'id="jaxdae.ModifiedLagrange"' in formulations
    assert "paper 004, eq. [30]" in formulations
    methods = (site / "methods" / "index.html").read_text(encoding="utf-8")
    assert "Mukharlyamov" in methods


def test_strict_build_fails_on_a_broken_link(tmp_path):
    """The check above can fail: the same build refuses a page whose link has no target."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [a page](missing.md).\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: check\nnav:\n  - Home: index.md\n")
    result = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "missing.md" in result.stdout + result.stderr
