"""Benchmark: writing an animation of a planar mechanism with `jaxdae.viz.animate`.

The slider-crank of `experiments/examples/slider_crank.py` (a crank of 0.1 m, a rod of
0.3 m and a slider, under gravity, from a crank angle of 0.5 rad at 10 rad/s) is simulated
for 1 s with 501 saved states, then animated with 500 frames (the saved states
interpolated) at 30 frames per second, with the path of the rod's centre traced, at the
default size (640 × 345 pixels at 100 dpi). For each output it reports the wall-clock time
of `Animation.save` (median and spread of `--repeats` writes) and the file's size:

- **MP4**: H.264 by the ffmpeg binary of imageio-ffmpeg, frames piped as raw RGBA;
- **GIF**: pillow, one palette for all frames.

Also the time to build the animation (`animate(...)`: the markers' positions at every
frame, the artists). Each frame redraws only the moving artists over a background drawn
once (blitting). Wall-clock times: on a shared machine, other processes count too.

    python experiments/benchmarks/bench_animate.py [--out output] [--repeats 3] [--frames 500]
    # prints a Markdown table, writes OUT/bench_animate/ (the MP4, the GIF, a JSON file,
    # and the table as `bench_animate.outputs` in tables.json)
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import jax  # noqa: E402
from _common import output_dir, write_json  # noqa: E402
from _tables import render, run_stamp, table, write  # noqa: E402

jax.config.update("jax_enable_x64", True)

from slider_crank import slider_crank_run  # noqa: E402

from jaxdae.viz import animate  # noqa: E402


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


COLUMNS = [
    ("output", "left"),
    ("time [s]", "right"),
    ("min–max [s]", "right"),
    ("per frame [ms]", "right"),
    ("file size [kB]", "right"),
]
LABELS = {
    "mp4": "MP4 (H.264, imageio-ffmpeg's ffmpeg)",
    "gif": "GIF (pillow)",
}


def table_row(name, times, size, frames):
    """A row of the table: the median of `times` [s] and their range, per frame where a file
    was written (`size`, bytes)."""
    median = statistics.median(times)
    per_frame = f"{1e3 * median / frames:.1f}" if size is not None else ""
    kb = f"{size / 1e3:.0f}" if size is not None else ""
    return [name, f"{median:.2f}", f"{min(times):.2f}–{max(times):.2f}", per_frame, kb]


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("output"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--frames", type=int, default=500)
    args = parser.parse_args()
    stamp = run_stamp()
    out = output_dir(args.out, "bench_animate")

    model, sol = slider_crank_run()
    build = timed(lambda: animate(model, sol, frames=args.frames, trace="rod"), args.repeats)
    anim = animate(model, sol, frames=args.frames, trace="rod")
    width, height = anim.figure.canvas.get_width_height()

    rows = [("build (`animate`)", build, None)]
    for suffix in ("mp4", "gif"):
        path = out / f"slider_crank.{suffix}"
        rows.append(
            (
                LABELS[suffix],
                timed(lambda path=path: anim.save(path), args.repeats),
                path.stat().st_size,
            )
        )

    print(
        f"Slider-crank, {len(anim)} frames at {anim.fps:g} fps, {width} × {height} px; "
        f"median of {args.repeats} (min–max), wall clock.\n"
    )
    results = {}
    for name, times, size in rows:
        results[name] = {"times_s": times, "median_s": statistics.median(times), "bytes": size}
    cells = [table_row(name, times, size, len(anim)) for name, times, size in rows]
    data = table("bench_animate.outputs", COLUMNS, cells, stamp)
    print(render(data))
    write(args.out, "bench_animate", [data])
    write_json(
        out / "bench_animate.json",
        {"frames": len(anim), "fps": anim.fps, "pixels": [width, height], "results": results},
    )


if __name__ == "__main__":
    main()
