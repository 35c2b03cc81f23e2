"""The figures of the guide "Seeing the motion" (docs/guides/seeing_the_motion.md), also
shown in README.md, building_a_mechanism.md and stabilization_two_link.md.

- `motion_plot.png`: `sol.plot()` of the slider-crank of experiments/examples/slider_crank.py
  (coordinates, constraint violation, energy drift, multipliers);
- `slider_crank.gif`: `jaxdae.viz.animate` of the slider-crank, the rod's centre traced, at a
  quarter of real speed;
- `slider_crank_frames.png`: three frames of that animation side by side;
- `two_link_frames.png`: three frames of Mukharlyamov and Deressa's (2015) two-link arm (drawn
  with `draw=`) before, at and after its singular configuration, under the modified Lagrange
  equation (experiments/examples/two_link_singularity.py);
- `bricard_viewer.png`, `urdf_arm_viewer.png`: Bricard's mechanism and the URDF arm in the 3-D
  viewer (`jaxdae.viz.view(...).save_html`), as headless Chromium shows the saved page
  (software WebGL); skipped where `chromium` is not on PATH.

Sizes are kept small (stills under 300 kB, the GIF under 1.5 MB); the script prints each,
and the time `animate` and `save` take for the slider-crank's 121 frames.

    python experiments/studies/docs_figures_motion.py [--out docs/figures] [--no-viewer]
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import _common  # noqa: F401  (the examples' folder on sys.path, the Agg backend)
import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from slider_crank import slider_crank_run  # noqa: E402

import jaxdae  # noqa: E402
import jaxdae.multibody as mb  # noqa: E402
import jaxdae.viz  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# headless Chromium, software WebGL; the virtual time lets the page load and play 1.5 s.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
    "--window-size=1000,700",
    "--virtual-time-budget=1500",
    "--hide-scrollbars",
]


def strip(animation, times, path: Path) -> None:
    """The frames of `animation` nearest to `times`, side by side, as a PNG."""
    from PIL import Image

    images = []
    for t in times:
        k = int(np.argmin(np.abs(animation.times - t)))
        canvas = animation.frame(k).canvas
        images.append(np.asarray(canvas.buffer_rgba())[..., :3].copy())
    Image.fromarray(np.concatenate(images, axis=1)).save(path, optimize=True)


def screenshot(chromium: str, page: Path, path: Path, box, width: int) -> None:
    """Headless Chromium's view (1000 × 700 px) of a viewer page, cropped to `box` (left,
    top, right, bottom; below viser's notice of software rendering, the top 188 px), scaled
    to `width` px, in 256 colours."""
    from PIL import Image

    with tempfile.TemporaryDirectory() as folder:
        shot = Path(folder) / "shot.png"
        subprocess.run(
            [chromium, *CHROMIUM_FLAGS, f"--screenshot={shot}", page.as_uri()],
            check=True,
            capture_output=True,
            timeout=300,
        )
        image = Image.open(shot).convert("RGB").crop(box)
    image = image.resize((width, round(width * image.height / image.width)), Image.LANCZOS)
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def viewer_figures(out: Path, chromium: str) -> list[Path]:
    import bricard as bricard_example
    import urdf_arm

    from jaxdae.examples._bricard import bricard

    written = []
    with tempfile.TemporaryDirectory() as folder:
        model = bricard()
        sol = bricard_example.simulate(model, 2.0, 201)
        page = Path(folder) / "bricard.html"
        jaxdae.viz.view(model, sol).save_html(page)
        screenshot(chromium, page, out / "bricard_viewer.png", (0, 188, 1000, 700), 800)
        written.append(out / "bricard_viewer.png")

        robot = mb.load_urdf(urdf_arm.URDF)
        model = robot.mechanism(
            forces=[
                mb.Gravity(),
                mb.SpringDamper("forearm.frame", "slider.frame", 200.0, 0.0, 0.45),
            ],
            limits=False,
        )
        q0, v0 = model.initial_state(joint_coordinates=urdf_arm.RATES, tol=1e-10)
        sol = jaxdae.simulate(
            model,
            jaxdae.Baumgarte(20.0, 100.0),
            0.0,
            2.0,
            q0,
            v0,
            ts=jnp.linspace(0.0, 2.0, 201),
            rtol=1e-10,
            atol=1e-10,
        )
        page = Path(folder) / "urdf_arm.html"
        jaxdae.viz.view(model, sol).save_html(page)
        # the arm is small in the default view: the middle of the page, without the player
        screenshot(chromium, page, out / "urdf_arm_viewer.png", (340, 250, 660, 430), 480)
        written.append(out / "urdf_arm_viewer.png")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "docs" / "figures",
        help="folder of the figures (default: docs/figures)",
    )
    parser.add_argument(
        "--no-viewer",
        action="store_true",
        help="leave out the 3-D viewer's screenshots (they take Chromium)",
    )
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    written = []

    model, sol = slider_crank_run()
    fig = sol.plot(names=model.coordinate_names, figsize=(8, 7))
    fig.savefig(out / "motion_plot.png", dpi=80)
    written.append(out / "motion_plot.png")

    start = time.perf_counter()
    animation = jaxdae.viz.animate(model, sol, trace="rod", frames=121, fps=30, dpi=80)
    made = time.perf_counter()
    animation.save(out / "slider_crank.gif")
    saved = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        animation.save(Path(folder) / "slider_crank.mp4")
    print(
        f"slider-crank, 121 frames at dpi 80: animate {made - start:.2f} s (with the "
        f"kinematics' compile), GIF {saved - made:.2f} s, MP4 {time.perf_counter() - saved:.2f} s"
    )
    written.append(out / "slider_crank.gif")
    stills = jaxdae.viz.animate(model, sol, trace="rod", frames=121, fps=30, dpi=60)
    strip(stills, (0.1, 0.3, 0.6), out / "slider_crank_frames.png")
    written.append(out / "slider_crank_frames.png")

    from two_link_singularity import arm_animation, formulation_for

    from jaxdae.examples import TwoLinkManipulator

    system = TwoLinkManipulator()
    q0, v0 = system.initial_state()
    t_singular = float(system.x0 / system.speed)
    arm = jaxdae.simulate(
        system,
        formulation_for("modified", dict(h=20, r=10, p=100, s=25, alpha=10)),
        0.0,
        2.0,
        q0,
        v0,
        ts=jnp.linspace(0.0, 2.0, 401),
    )
    stills = arm_animation(system, np.asarray(arm.ts), np.asarray(arm.q), dpi=60)
    strip(stills, (0.2, t_singular, 1.5), out / "two_link_frames.png")
    written.append(out / "two_link_frames.png")

    chromium = shutil.which("chromium")
    if args.no_viewer:
        pass
    elif chromium is None:
        print("no `chromium` on PATH: the viewer's screenshots are left out")
    else:
        written += viewer_figures(out, chromium)
    for path in written:
        print(f"{path}: {path.stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
