"""Every notebook in notebooks/ runs top to bottom without error.

Notebooks listed in SLOW run only with `-m slow` (they compile many programs).
"""

import os
import sys
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
# The longest notebooks (on a clean checkout: Mukharlyamov (2019)'s ≈ 60 s; building a
# mechanism ≈ 2 min of CPU, its models tested in test_multibody*.py), and those of Shemelova
# (2016), Matyukhin (1999) and Mukharlyamov and Deressa (2015)
# (≈ 20 s each; their experiments' methods are tested in test_hamiltonian.py,
# test_realizing_forces.py and test_core.py), and the friction fit (it traces and compiles
# three derivative programs through contact, a minute or more each); `make test-slow` runs them. The
# quickstart runs in the default test run.
SLOW: set[str] = {
    "paper_000_redundant_coordinates",
    "paper_001_hamiltonian",
    "paper_002_adaptive_optics",
    "paper_003_realizing_forces",
    "paper_004_two_link",
    "tuning",
    "building_a_mechanism",
    "impacts",
    "friction_fit",
}


def _params():
    for path in NOTEBOOKS:
        marks = [pytest.mark.slow] if path.stem in SLOW else []
        yield pytest.param(path, id=path.stem, marks=marks)


@pytest.mark.slow
@pytest.mark.parametrize("path", list(_params()))
def test_notebook_runs(path, tmp_path, monkeypatch):
    # The kernel must be this interpreter (the project's venv), not whatever `python` is first.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=900,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
