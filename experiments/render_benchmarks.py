"""Render the tables of docs/benchmarks.md from the data of the runs that measured them.

A table on the page sits between two markers,

    <!-- table: bench_compile.ball -->
    ...
    <!-- /table -->

and is rendered from `docs/benchmark_data/<name>.json` (`experiments/_tables.py`): a line
stating the run (machine, load, date, commit, command), then the table. A benchmark run with
`--out OUT` writes its tables to `OUT/<benchmark>/tables.json`; `--collect OUT` copies them
into `docs/benchmark_data/`, so that the page shows the figures of that run.

    python experiments/render_benchmarks.py --collect output   # after `make bench`
    python experiments/render_benchmarks.py --check            # the page is current
"""

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _tables import ROOT, render  # noqa: E402

PAGE = ROOT / "docs" / "benchmarks.md"
DATA = ROOT / "docs" / "benchmark_data"
_BLOCK = re.compile(r"(<!-- table: ([\w.-]+) -->\n)(.*?)(<!-- /table -->)", re.S)


def collect(out: Path) -> list[str]:
    """Copies the tables of every `out/*/tables.json` into `DATA`; their names."""
    names = []
    for path in sorted(Path(out).glob("*/tables.json")):
        for data in json.loads(path.read_text(encoding="utf-8")):
            DATA.mkdir(parents=True, exist_ok=True)
            target = DATA / f"{data['name']}.json"
            target.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
            names.append(data["name"])
    return names


def rendered(page: str) -> str:
    """`page` with each marked table rendered from its data."""

    def block(match):
        path = DATA / f"{match.group(2)}.json"
        if not path.exists():
            raise SystemExit(f"docs/benchmarks.md marks table {match.group(2)!r}; no {path}")
        data = json.loads(path.read_text(encoding="utf-8"))
        return match.group(1) + render(data) + "\n" + match.group(4)

    return _BLOCK.sub(block, page)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collect", type=Path, help="a benchmark output root to take tables from")
    parser.add_argument("--check", action="store_true", help="fail if the page is not current")
    options = parser.parse_args()
    if options.collect:
        print("collected:", ", ".join(collect(options.collect)) or "nothing")
    page = PAGE.read_text(encoding="utf-8")
    new = rendered(page)
    if options.check:
        if new != page:
            print("docs/benchmarks.md differs from its data: run render_benchmarks.py")
            return 1
        return 0
    PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
