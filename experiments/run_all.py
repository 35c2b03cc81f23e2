"""The main job: reproduce every paper's worked example, write figures and SUMMARY.md.

Each experiment module has `main(out: Path, quick: bool) -> dict` returning a summary with a
`"headline"` (one line) and a `"table"` (Markdown lines); run one alone with
`python experiments/<name>.py --out output`.
"""

import argparse
import importlib
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

EXPERIMENTS = [
    "two_link_singularity",
    "ball_and_beam",
    "tune_two_link",
    "tune_ball_and_beam",
    "cartesian_arm_hamiltonian",
    "realizing_forces",
    "adaptive_optics",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("output"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="*", default=None, help="run only these experiments")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    lines = ["# jaxdae demo: the papers' worked examples", ""]
    failed = []
    for name in args.only or EXPERIMENTS:
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        try:
            summary = importlib.import_module(name).main(args.out, quick=args.quick)
        except Exception:  # report and go on: one broken study must not hide the others
            traceback.print_exc()
            failed.append(name)
            lines += [f"## {name}", "", "FAILED (see the log).", ""]
            continue
        elapsed = time.perf_counter() - start
        lines += [f"## {name} ({elapsed:.0f} s)", "", summary.get("headline", ""), ""]
        lines += list(summary.get("table", [])) + [""]
        lines += [f"Figures and data: `{args.out / name}/`", ""]
    (args.out / "SUMMARY.md").write_text("\n".join(lines))
    print(f"wrote {args.out / 'SUMMARY.md'}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
