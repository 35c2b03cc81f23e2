"""Shared plumbing for the experiment scripts: command line, output folder, JSON."""

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")


def parse_args(name: str, description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--out", type=Path, default=Path("output"),
        help=f"output root; results go to OUT/{name}/ (default: output)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller sizes, for smoke tests"
    )
    return parser.parse_args()


def output_dir(root: Path, name: str) -> Path:
    path = Path(root) / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(path: Path, data) -> None:
    def default(x):
        try:
            return x.tolist()
        except AttributeError:
            return str(x)

    Path(path).write_text(json.dumps(data, indent=2, default=default))
