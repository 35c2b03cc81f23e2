"""The 3-D viewer on Bricard's mechanism: how long `jaxdae.viz.view` takes to turn a 10 s
run into a standalone HTML page at 30 fps (301 frames), and how long headless Chromium takes
to open it.

- **Build**: `view(model, sol)`: the frames' coordinates interpolated from the 1,001 saved
  states, the bodies' and joints' poses from the mechanism's kinematics (one jitted call;
  its compile is in the cold figure only).
- **Write**: `viewer.save_html(path)`: viser records the scene and the 301 frames of pose
  updates, compresses them (zstd) and inlines them into its client page.
- **Browser**: `chromium --headless --screenshot` of the page with a 100 ms virtual time
  budget (software WebGL): browser start, the page's decompression, the first frames drawn;
  where `chromium` is on PATH. Beside it the same for a viser page with one box: the cost
  of the client itself under software rendering.

The simulation itself is not timed (see `experiments/examples/bricard.py`). Figures: the
median of `--repeats` calls after one cold call (float64, CPU).

With `--out OUT` the table is also written to `OUT/bench_viewer/tables.json`
(`bench_viewer.steps`).

    python experiments/benchmarks/bench_viewer.py [--repeats 3] [--out output]
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _tables
from _tables import render, run_stamp, table, write  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jaxdae  # noqa: E402
from jaxdae.examples._bricard import bricard  # noqa: E402
from jaxdae.viz._viewer import view  # noqa: E402


def browser_seconds(chromium: str, page: Path, shot: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--use-angle=swiftshader",
            "--enable-unsafe-swiftshader",
            "--window-size=1000,700",
            "--virtual-time-budget=100",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return time.perf_counter() - start


def one_box_page(path: Path) -> None:
    import contextlib
    import io

    import viser

    with contextlib.redirect_stdout(io.StringIO()):
        server = viser.ViserServer(host="127.0.0.1", port=8765, verbose=False)
        server.scene.add_box("/box", color=(255, 0, 0), dimensions=(1.0, 1.0, 1.0))
        path.write_text(server.scene.as_html(), encoding="utf-8")
        server.stop()


def columns(repeats: int) -> list[tuple[str, str]]:
    return [("step", "left"), ("cold [s]", "right"), (f"median of {repeats} [s]", "right")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--out", type=Path, default=None, help="also write the table to OUT/bench_viewer/"
    )
    args = parser.parse_args()
    stamp = run_stamp()
    model = bricard()
    q0, v0 = model.initial_state()
    sol = jaxdae.simulate(
        model,
        jaxdae.PseudoInverse(20.0, 100.0),
        0.0,
        10.0,
        q0,
        v0,
        ts=jnp.linspace(0.0, 10.0, 1001),
        rtol=1e-8,
        atol=1e-10,
        max_steps=200_000,
    )
    jax.block_until_ready(sol.q)
    chromium = shutil.which("chromium")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        page, shot = Path(folder) / "bricard.html", Path(folder) / "bricard.png"
        timings: dict[str, list[float]] = {"build": [], "write": [], "browser": [], "box": []}
        box = Path(folder) / "box.html"
        one_box_page(box)
        for _ in range(args.repeats + 1):
            start = time.perf_counter()
            viewer = view(model, sol, fps=30)
            built = time.perf_counter()
            viewer.save_html(page)
            written = time.perf_counter()
            timings["build"].append(built - start)
            timings["write"].append(written - built)
            if chromium is not None:
                timings["browser"].append(browser_seconds(chromium, page, shot))
                timings["box"].append(browser_seconds(chromium, box, shot))
        size = page.stat().st_size
        frames = viewer.num_frames
    for key, label in (("build", "`view(model, sol)`"), ("write", "`save_html`")):
        cold, warm = timings[key][0], statistics.median(timings[key][1:])
        rows.append([label, f"{cold:.2f}", f"{warm:.2f}"])
    total = [b + w for b, w in zip(timings["build"], timings["write"], strict=True)]
    rows.append(["build + write", f"{total[0]:.2f}", f"{statistics.median(total[1:]):.2f}"])
    for key, label in (
        ("browser", "headless Chromium: open the page, first frames"),
        ("box", "headless Chromium: a viser page with one box"),
    ):
        if timings[key]:
            rows.append(
                [label, f"{timings[key][0]:.2f}", f"{statistics.median(timings[key][1:]):.2f}"]
            )
    print(f"Bricard's mechanism, 10 s at 30 fps: {frames} frames, HTML {size / 1e6:.2f} MB\n")
    data = table("bench_viewer.steps", columns(args.repeats), rows, stamp)
    print(render(data))
    if args.out is not None:
        print("wrote", write(args.out, "bench_viewer", [data]))


if __name__ == "__main__":
    main()
