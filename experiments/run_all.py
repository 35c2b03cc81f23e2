"""Reproduce the papers' worked examples: figures, data and a summary in one folder.

Runs each experiment below in turn (the scripts in experiments/examples/ and, on request,
experiments/studies/), writes its figures and data to OUT/<name>/ and a
summary of all of them to OUT/SUMMARY.md (one section per experiment: its headline, its
table and a link to each figure with a one-line caption). A failing experiment is
reported and the others still run; the exit status is 1 if any failed. The benchmark
studies (projection, stiff_integration, work_precision) run only when named with `--only`,
in their quick form (their quick runs take tens of minutes, compile-dominated); run their
scripts directly for the full studies.

A progress bar runs over the experiments and inside the long ones (sweeps, tuning loops)
when the output is a terminal; in a log or CI a line per experiment and per loop instead
(set NO_PROGRESS=1 to force that on a terminal too).
"""

import argparse
import contextlib
import importlib
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

from _common import interactive  # noqa: E402

# name: what it reproduces (one line, shown by --help)
EXPERIMENTS = {
    "two_link_singularity": "Mukharlyamov and Deressa (2015): a two-link arm through a singular "
    "configuration",
    "ball_and_beam": "Krasinskaya and Krasinskiy (2013): LQR of the simplified model on the exact "
    "Ball & Beam",
    "tune_two_link": "Mukharlyamov and Deressa (2015): modified-Lagrange gains tuned for a "
    "fixed-step solver",
    "tune_ball_and_beam": "Krasinskaya and Krasinskiy (2013): LQR weights tuned through the "
    "nonlinear closed loop",
    "cartesian_arm_hamiltonian": "Shemelova (2016): Hamiltonian arm, exact decay of perturbations",
    "realizing_forces": "Matyukhin (1999): nonholonomic constraints realized by forces",
    "adaptive_optics": "Mukharlyamov (2019): constraint-enforcing control through a DC motor",
    "slider_crank": "a slider-crank from jaxdae.multibody parts: plotted and animated (MP4, GIF)",
    "impacts": "one-sided constraints: impacts and joint limits vs closed forms and MuJoCo",
    "quadruped_drop": "contact in space: a quadruped lands and stands by time stepping, vs "
    "MuJoCo and pybullet",
    "rolling_disc": "contact in space: a coin rolling on its rim vs the reduced rolling-disc "
    "equations",
    "projection": "projection onto the constraints after each step: drift and cost",
    "stiff_integration": "stiff systems: implicit against explicit solvers",
    "work_precision": "error against CPU time, every formulation x integrator",
}
# Studies that run in their --quick form here even in a full run (the full forms take
# tens of minutes each; run them directly, as their guides say).
ALWAYS_QUICK = {"projection", "stiff_integration", "work_precision"}
# ... and that run only when named (`--only`), not in the demo.
ON_REQUEST = ALWAYS_QUICK

EPILOG = (
    "experiments:\n"
    + "\n".join(f"  {name:<27} {text}" for name, text in EXPERIMENTS.items())
    + """

examples:
  python experiments/run_all.py --out output          all but the studies (make demo)
  python experiments/run_all.py --quick --out /tmp/x  smoke test of the demo
  python experiments/run_all.py --only ball_and_beam,tune_two_link
"""
)


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown experiment(s) {', '.join(unknown)}; choose from {', '.join(EXPERIMENTS)}"
        )
    return names


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("output"),
        help="output folder: OUT/SUMMARY.md and OUT/<name>/ per experiment (default: output)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller grids, fewer tuning steps and shorter horizons: a smoke test that "
        "takes a fraction of the full run's time; figures are coarser and the numbers "
        "differ from the full run's",
    )
    parser.add_argument(
        "--only",
        metavar="NAME[,NAME...]",
        type=_names,
        action="extend",
        default=None,
        help="run only these experiments, in the order given (names below; the option "
        "may be repeated)",
    )
    return parser.parse_args(argv)


def _section(name, summary, elapsed, out: Path) -> list[str]:
    lines = [f"## {name} ({elapsed:.0f} s)", "", summary.get("headline", ""), ""]
    lines += list(summary.get("table", [])) + [""]
    figures = summary.get("figures", [])
    for fig in figures:
        path = out / fig["path"]  # (an absolute path stays as it is)
        link = Path(os.path.relpath(path, out)).as_posix()
        missing = "" if path.exists() else " (missing: the experiment did not write it)"
        lines.append(f"- [{path.name}]({link}): {fig['caption']}{missing}")
    lines += ([""] if figures else []) + [f"Figures and data: [{name}/]({name}/)", ""]
    return lines


def run(names: list[str], out: Path, quick: bool) -> list[str]:
    """Runs the experiments, writes OUT/SUMMARY.md; returns the names of those that failed."""
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    mode = "quick" if quick else "full"
    lines = ["# jaxdae demo: the papers' worked examples", ""]
    sections, failed, total_start = [], [], time.perf_counter()
    bars = interactive()
    stdout = sys.stdout
    with contextlib.ExitStack() as stack:
        if bars:
            from tqdm.auto import tqdm
            from tqdm.contrib import DummyTqdmFile

            # Prints go through tqdm.write so that they do not break the bars.
            stack.enter_context(contextlib.redirect_stdout(DummyTqdmFile(stdout)))
            overall = stack.enter_context(
                tqdm(
                    total=len(names),
                    desc="demo",
                    unit="experiment",
                    dynamic_ncols=True,
                    file=sys.stderr,
                )
            )
        for i, name in enumerate(names, 1):
            print(f"== [{i}/{len(names)}] {name}", flush=True)
            if bars:
                overall.set_postfix_str(name)
            start = time.perf_counter()
            try:
                summary = importlib.import_module(name).main(
                    out, quick=quick or name in ALWAYS_QUICK
                )
            except Exception:  # report and go on: one broken study must not hide the others
                traceback.print_exc()
                failed.append(name)
                sections += [f"## {name}", "", "FAILED (see the log).", ""]
            else:
                elapsed = time.perf_counter() - start
                sections += _section(name, summary, elapsed, out)
                print(f"== [{i}/{len(names)}] {name}: done in {elapsed:.0f} s", flush=True)
            if bars:
                overall.update(1)
    total = time.perf_counter() - total_start
    command = "python experiments/run_all.py" + (" --quick" if quick else "")
    if list(names) != list(EXPERIMENTS):
        command += " --only " + ",".join(names)
    count = f"{len(names)} experiment" + ("s" if len(names) > 1 else "")
    lines += [
        (
            f"`{command}` ({mode} run, {count}, {total:.0f} s). Each section gives the "
            "experiment's headline, its table and its figures."
        ),
        "",
    ]
    (out / "SUMMARY.md").write_text("\n".join(lines + sections))
    print(f"wrote {out / 'SUMMARY.md'} ({total:.0f} s)")
    return failed


def main(argv=None) -> int:
    args = parse_args(argv)
    names = args.only or [name for name in EXPERIMENTS if name not in ON_REQUEST]
    failed = run(names, args.out, args.quick)
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")
    sys.exit(main())
