"""The documentation: the site builds with `mkdocs build --strict` (every page in the nav
exists, every link and anchor between pages resolves, every `[`jaxdae.X`][]` cross-reference
in a docstring names a documented object), and every equation that the code, the notebooks
and the docs cite ("Mukharlyamov and Deressa (2015), eq. [16]") is stated on the methods page,
docs/methods.md."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def require_mkdocs():
    for module, package in (
        ("mkdocs", "mkdocs"),
        ("mkdocstrings", "mkdocstrings[python]"),
        ("material", "mkdocs-material"),
    ):
        pytest.importorskip(module, reason=f"{package} is not installed: pip install -e '.[docs]'")


def build(config: Path, site_dir: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of `config` into `site_dir` (the command `make docs` runs)."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(config),
            "--site-dir",
            str(site_dir),
        ],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_site_builds_without_warnings(tmp_path):
    require_mkdocs()
    site = tmp_path / "site"
    result = build(ROOT / "mkdocs.yml", site)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{output}"
    assert "WARNING" not in output, output
    # The API reference is generated from the docstrings.
    formulations = (site / "api" / "formulations" / "index.html").read_text(encoding="utf-8")
    assert 'id="jaxdae.ModifiedLagrange"' in formulations
    assert "Mukharlyamov and Deressa (2015), eq. [30]" in formulations
    methods = (site / "methods" / "index.html").read_text(encoding="utf-8")
    assert "Mukharlyamov" in methods


def test_strict_build_fails_on_a_broken_link(tmp_path):
    """The check above can fail: the same build refuses a page whose link has no target."""
    require_mkdocs()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [a page](missing.md).\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: check\nnav:\n  - Home: index.md\n")
    result = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "missing.md" in result.stdout + result.stderr


# -- citations ---------------------------------------------------------------------------

_EQ = r"\[(\d+(?:\.\d+)?)\]"
_RANGE = re.compile(_EQ + r"\s*[–-]\s*" + _EQ)
# The papers as the code and the docs cite them (docs/methods.md, "The papers").
_PAPERS = {
    "Krasinskaya and Krasinskiy (2013)": "000",
    "Shemelova (2016)": "001",
    "Mukharlyamov (2019)": "002",
    "Matyukhin (1999)": "003",
    "Mukharlyamov and Deressa (2015)": "004",
}
_NAME = (
    r"(Krasinskaya and Krasinskiy|Shemelova|Mukharlyamov and Deressa|Mukharlyamov|"
    r"Matyukhin)(?:'s)?\s+\((\d{4})\)"
)
_PAPER = re.compile(_NAME)
_LIST = r"((?:" + _EQ + r"(?:\s*[–-]\s*" + _EQ + r")?(?:,\s*)?)+)"
_CITATION = re.compile(r"eqs?\.\s*" + _LIST + r"|" + _NAME + r",?\s+" + _LIST)


def _paper(match) -> str | None:
    """The paper's key for a match of `_PAPER` (None for a name and year of no paper)."""
    return _PAPERS.get(f"{match.group(1)} ({match.group(2)})")


def _equations(text: str) -> set[str]:
    """Equation numbers in `text`, with ranges `[22]–[31]` and `[2.9]–[2.11]` filled in."""
    found = set(re.findall(_EQ, text))
    for match in _RANGE.finditer(text):
        a, b = match.groups()
        if "." not in a + b:
            found |= {str(i) for i in range(int(a), int(b) + 1)}
        elif "." in a and "." in b and a.split(".")[0] == b.split(".")[0]:
            major = a.split(".")[0]
            found |= {f"{major}.{i}" for i in range(int(a.split(".")[1]), int(b.split(".")[1]) + 1)}
    return found


def _citations(text: str):
    """`(paper, equation, line)` for each "eq. [n]" / "Author (year), [n]" in `text`. A citation
    belongs to the last paper named before it in its paragraph (or docstring), else to the
    first paper the file names."""
    first = _PAPER.search(text)
    offset = 0
    for chunk in re.split(r'(\n\s*\n|""")', text):
        papers = [(m.start(), _paper(m)) for m in _PAPER.finditer(chunk)]
        for match in _CITATION.finditer(chunk):
            before = [paper for start, paper in papers if start <= match.start()]
            paper = before[-1] if before else (_paper(first) if first else None)
            line = text.count("\n", 0, offset + match.start()) + 1
            for equation in re.findall(_EQ, match.group(0)):
                if paper is not None:
                    yield paper, equation, line
        offset += len(chunk)


def test_every_cited_equation_is_on_the_methods_page():
    methods = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    parts = re.split(r"^## (.+? \(\d{4}\)):", methods, flags=re.M)
    stated = {_PAPERS[parts[i]]: _equations(parts[i + 1]) for i in range(1, len(parts), 2)}
    assert sorted(stated) == ["000", "001", "002", "003", "004"]
    files = [
        *ROOT.glob("jaxdae/**/*.py"),
        *ROOT.glob("experiments/**/*.py"),
        *ROOT.glob("notebooks/*.ipynb"),
        *ROOT.glob("docs/**/*.md"),
        ROOT / "README.md",
    ]
    checked, missing = 0, []
    for path in files:
        if path.name == "methods.md":
            continue
        for paper, equation, line in _citations(path.read_text(encoding="utf-8")):
            checked += 1
            if equation not in stated[paper]:
                cited = next(name for name, key in _PAPERS.items() if key == paper)
                missing.append(f"{path.relative_to(ROOT)}:{line}: {cited}, eq. [{equation}]")
    assert checked > 50  # the pattern still finds the project's citations
    assert not missing, (
        "cited but not stated in docs/methods.md (add the equation to its "
        "paper's section):\n" + "\n".join(missing)
    )


def test_citation_check_can_fail():
    text = (
        '"""Uses Mukharlyamov and Deressa (2015), eq. [16] and eqs. [22]–[31]; Mukharlyamov '
        '(2019), eq. [9.9]."""'
    )
    assert set(_citations(text)) == {
        ("004", "16", 1),
        ("004", "22", 1),
        ("004", "31", 1),
        ("002", "9.9", 1),
    }
    assert "9.9" not in _equations("[0.11]–[0.12], [2.9]–[2.11]")
    assert {"2.9", "2.10", "2.11", "0.11", "0.12"} <= _equations("[0.11]–[0.12], [2.9]–[2.11]")


def test_every_public_name_is_in_the_api_reference():
    """Each class and function exported by `jaxdae`, `jaxdae.examples` and `jaxdae.multibody`
    has a `::: name` entry on a page of docs/api/ (constants and subpackages excepted)."""
    import jaxdae

    documented = set()
    for page in (ROOT / "docs" / "api").glob("*.md"):
        documented |= set(
            re.findall(r"^::: ([\w.]+)$", page.read_text(encoding="utf-8"), flags=re.M)
        )
    missing = []
    for module in (jaxdae, jaxdae.examples, jaxdae.multibody):
        for name in dir(module):
            value = getattr(module, name)
            if name.startswith("_") or name.isupper() or type(value).__name__ == "module":
                continue
            if f"{module.__name__}.{name}" not in documented:
                missing.append(f"{module.__name__}.{name}")
    assert not missing, f"add to a page of docs/api/ (and to mkdocs.yml's nav): {missing}"


def test_design_measurement_links_resolve():
    """Every `docs/design_measurements.md#anchor` that the code cites names a section of
    that page, and no module comment or docstring carries timings or measured ratios
    itself."""
    page = (ROOT / "docs" / "design_measurements.md").read_text(encoding="utf-8")
    anchors = set(re.findall(r"\{ #([\w-]+) \}", page))
    cited, timings = set(), []
    # Timings, and measured ratios ("1.8× faster", "3 times slower"; not a "3 × 3" matrix).
    timing = re.compile(
        r"\d(?:\.\d+)? ?(?:µs|ms)\b"
        r"|\d(?:\.\d+)? ?(?:×|times) (?:faster|slower|longer|shorter|more|less|fewer)\b"
    )
    for path in ROOT.glob("jaxdae/**/*.py"):
        text = path.read_text(encoding="utf-8")
        cited |= set(re.findall(r"docs/design_measurements\.md#([\w-]+)", text))
        timings += [
            f"{path.relative_to(ROOT)}: {line.strip()}"
            for line in text.splitlines()
            if timing.search(line)
        ]
    assert cited, "the pattern finds the code's links"
    assert cited <= anchors, f"links to missing sections: {sorted(cited - anchors)}"
    assert not timings, "timings belong on docs/design_measurements.md:\n" + "\n".join(timings)


def _commit_hashes_in_prose(text: str) -> list[str]:
    """The lines of a Markdown page that name a commit (a hexadecimal hash of 7 to 40 digits
    in backticks or after "commit") other than a run's stamp line, the italic line above a
    measurement that states its machine, date and commit ("*…, jaxdae at `abc1234`, …*")."""
    commit = re.compile(r"`[0-9a-f]{7,40}`|\bcommits? [0-9a-f]{7,40}\b")
    return [
        line.strip()
        for line in text.splitlines()
        if commit.search(line) and not (line.startswith("*") and "jaxdae at `" in line)
    ]


def test_docs_prose_names_no_commit():
    """The docs describe jaxdae as it is: a measurement states its commit once, on its stamp
    line, and the prose around it names none (no "measured at commit …" history). The raw
    output kept under docs/measurements/ is left as it was printed."""
    pages = [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("experiments/**/*.md")]
    found = [
        f"{page.relative_to(ROOT)}: {line}"
        for page in pages
        if "measurements" not in page.relative_to(ROOT).parts[:2]
        for line in _commit_hashes_in_prose(page.read_text(encoding="utf-8"))
    ]
    assert not found, "commits named in prose:\n" + "\n".join(found)


def test_commit_check_can_fail():
    page = "*2-core CPU, jaxdae at `46b2ee1`, JAX 0.10.2: `python x.py`*\n\nAs at commit 46b2ee1.\n"
    assert _commit_hashes_in_prose(page) == ["As at commit 46b2ee1."]
    assert _commit_hashes_in_prose("Measured at `8954cf5`.") == ["Measured at `8954cf5`."]


# -- results -----------------------------------------------------------------------------


def _documented_results(page: str) -> set[str]:
    """The `RESULTS.` names in the first column of the table of docs/failures.md's section
    "What each result means and what to do"."""
    section = page.split("## What each result means and what to do", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    first_cells = [row.split("|")[1] for row in rows[2:]]  # past the header and the rule
    return {name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)}


def _results_jaxdae_declares() -> set[str]:
    """The members that the class body of `RESULTS` in jaxdae/_solution.py assigns (those
    it inherits are diffrax's)."""
    import ast

    tree = ast.parse((ROOT / "jaxdae" / "_solution.py").read_text(encoding="utf-8"))
    body = next(
        node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == "RESULTS"
    ).body
    return {
        target.id
        for node in body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def test_every_result_has_a_row_in_the_failures_page():
    """Each member of `jaxdae.RESULTS`, its own and those it inherits from diffrax, is named
    in the first column of docs/failures.md's table of results."""
    import jaxdae

    documented = _documented_results((ROOT / "docs" / "failures.md").read_text(encoding="utf-8"))
    declared = _results_jaxdae_declares()
    assert "impact_not_solved" in declared and "successful" in documented  # the parsers work
    missing = sorted(declared - documented)
    assert not missing, (
        "add a row to docs/failures.md, 'What each result means and what to "
        f"do', for RESULTS.{', RESULTS.'.join(missing)}"
    )
    unknown = sorted(name for name in documented if not hasattr(jaxdae.RESULTS, name))
    assert not unknown, f"docs/failures.md names results that do not exist: {unknown}"
    # Every name documented is a member: equal counts mean no member (diffrax's included)
    # lacks a row.
    assert len(documented) == len(jaxdae.RESULTS), (
        f"jaxdae.RESULTS has {len(jaxdae.RESULTS)} members, docs/failures.md names "
        f"{len(documented)}: a member inherited from diffrax.RESULTS has no row "
        f"(documented: {sorted(documented)})"
    )


def test_results_check_can_fail():
    page = (
        "## What each result means and what to do\n\n| `RESULTS.` | Meaning | What to do |\n"
        "|---|---|---|\n| `successful` | reached `t1` | — |\n| `a`, `b` | x | `c` |\n\n"
        "## Next\n\n| `d` | | |\n"
    )
    assert _documented_results(page) == {"successful", "a", "b"}


# -- benchmark tables --------------------------------------------------------------------


def _benchmark_renderer():
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import render_benchmarks  # pyright: ignore[reportMissingImports]
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    return render_benchmarks


def test_benchmark_tables_are_rendered_from_their_data():
    """Each marked table of docs/benchmarks.md is the rendering of the data of the run that
    measured it (`docs/benchmark_data/`, `experiments/render_benchmarks.py`), below the line
    that states that run: none is edited by hand."""
    renderer = _benchmark_renderer()
    page = renderer.PAGE.read_text(encoding="utf-8")
    names = re.findall(r"<!-- table: ([\w.-]+) -->", page)
    assert names, "the page marks its rendered tables"
    for name in names:
        assert (renderer.DATA / f"{name}.json").exists(), name
    assert renderer.rendered(page) == page, "run `python experiments/render_benchmarks.py`"


def test_benchmark_table_check_can_fail():
    renderer = _benchmark_renderer()
    page = renderer.PAGE.read_text(encoding="utf-8")
    start = re.search(r"<!-- table: [\w.-]+ -->\n", page).start()
    row = page.index("\n| ", page.index("| ---", start)) + 1
    edited = page[:row] + "| by hand " + page[row + 1 :]
    assert renderer.rendered(edited) == page != edited
