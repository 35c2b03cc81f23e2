"""Benchmark tables as data: what a benchmark writes to its JSON, and the Markdown that
`experiments/render_benchmarks.py` puts between the markers of docs/benchmarks.md.

A table is a dict: its `name` (the marker's), its `columns` (title and alignment), its
`rows` (cells as the page shows them) and the `stamp` of the run that measured it (machine,
load, date, commit, command), which the page states once, above the table.
"""

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def commit() -> str:
    """The checkout's commit, with `+ local changes` where its tracked files differ."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=7", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--", "jaxdae", "experiments"], cwd=ROOT
        ).returncode
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + (" + local changes" if changed else "")


def run_stamp() -> dict:
    """Where and when a run measures: the machine, its load at the start, the date, the
    commit and the command line."""
    import jax

    device = jax.devices()[0]
    machine = (
        f"{os.cpu_count()}-core CPU ({_cpu()})"
        if device.platform == "cpu"
        else f"{device.device_kind}"
    )
    script = Path(sys.argv[0])
    try:
        script = script.resolve().relative_to(ROOT)
    except ValueError:
        pass
    return {
        "machine": machine,
        "load": round(os.getloadavg()[0], 1),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "commit": commit(),
        "jax": jax.__version__,
        "command": " ".join(["python", str(script), *sys.argv[1:]]),
    }


def table(name: str, columns: list[tuple[str, str]], rows: list[list], stamp: dict) -> dict:
    """A table named `name` (its marker in docs/benchmarks.md): `columns` as `(title,
    "left" | "right")`, `rows` of cells (numbers as the page shows them: strings)."""
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"table {name!r}: a row of {len(row)} cells for {len(columns)}")
    return {
        "name": name,
        "columns": [{"title": t, "align": a} for t, a in columns],
        "rows": [[str(cell) for cell in row] for row in rows],
        "stamp": stamp,
    }


def write(out: Path, script: str, tables: list[dict]) -> Path:
    """Adds `tables` to `out/<script>/tables.json` (a table of the same name is replaced), where
    `experiments/render_benchmarks.py --collect out` takes them from; the file's path."""
    folder = Path(out) / script
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tables.json"
    kept = json.loads(path.read_text(encoding="utf-8")) if path.exists() else []
    names = {t["name"] for t in tables}
    kept = [t for t in kept if t["name"] not in names] + tables
    path.write_text(json.dumps(kept, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def render(data: dict) -> str:
    """The table as Markdown, below a line that states its run."""
    stamp = data["stamp"]
    # A run recorded before its script wrote data may lack its load (`null`).
    load = "" if stamp.get("load") is None else f", load {stamp['load']}"
    caption = (
        f"*{stamp['machine']}{load}, {stamp['date']}, jaxdae at "
        f"`{stamp['commit']}`, JAX {stamp['jax']}: `{stamp['command']}`*"
    )
    titles = [c["title"] for c in data["columns"]]
    rule = ["---:" if c["align"] == "right" else "---" for c in data["columns"]]
    lines = [caption, "", "| " + " | ".join(titles) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in data["rows"]]
    return "\n".join(lines)
