"""A slider-crank from nothing to a plotted and animated trajectory with `jaxdae.multibody`.

A crank (0.1 m, turning about its centre of mass), a connecting rod (0.3 m) and a slider on
the x axis, under gravity, started at a crank angle of 0.5 rad turning at 10 rad/s; simulated
for 1 s with Baumgarte stabilization. The figure shows the slider's position against the
crank angle and the largest constraint violation over time; the animation (`jaxdae.viz`, the
`viz` extra) shows the mechanism moving, with the path of the rod's centre traced, at a
quarter of real speed. The model and the simulation (`slider_crank_run`, which the
animation benchmark and the docs' figures run too), the plot and the animation are the
lines between the markers below; after them a smaller GIF of the same animation is written
(`--quick`: the GIF only, with fewer frames).

    python experiments/examples/slider_crank.py [--out output] [--quick]
    # writes OUT/slider_crank/slider_crank.png, slider_crank.mp4 and slider_crank.gif
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import jax.numpy as jnp
import matplotlib.pyplot as plt
from _common import figure, output_dir, parse_args

import jaxdae
import jaxdae.viz
from jaxdae.examples._slider_crank import slider_crank

NAME = "slider_crank"


def slider_crank_run(t1: float = 1.0, num: int = 501):
    """`(model, solution)`: the slider-crank from a crank angle of 0.5 rad at 10 rad/s under
    `Baumgarte(20, 100)` for `t1` seconds, `num` saved states."""
    # --- user code: model and simulation ---
    model = slider_crank()  # bodies, joints, gravity: jaxdae/examples/_slider_crank.py
    q0, v0 = model.initial_state(joint_coordinates={"crank": (0.5, 10.0)})
    sol = jaxdae.simulate(
        model, jaxdae.Baumgarte(20.0, 100.0), 0.0, t1, q0, v0, ts=jnp.linspace(0.0, t1, num)
    )
    # --- end of user code ---
    return model, sol


def main(out: Path, quick: bool = False) -> dict:
    folder = output_dir(out, NAME)
    model, sol = slider_crank_run()
    # --- user code: plot, animation ---
    c = model.joint_coordinates(sol.q)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    ax1.plot(c["crank"], c["slide"]), ax1.set(xlabel="crank angle [rad]", ylabel="slider x [m]")
    ax2.semilogy(sol.ts, abs(sol.phi).max(1)), ax2.set(xlabel="t [s]", ylabel="max |Φ| [m, rad]")
    fig.savefig(folder / "slider_crank.png", dpi=120)
    animation = jaxdae.viz.animate(model, sol, trace="rod", frames=121, fps=30, dpi=80)
    if not quick:
        animation.save(folder / "slider_crank.mp4")  # 121 frames at 30 fps: 4 s for 1 s
    # --- end of user code ---
    plt.close(fig)
    small = jaxdae.viz.animate(model, sol, trace="rod", frames=31 if quick else 61, fps=15, dpi=50)
    small.save(folder / "slider_crank.gif")
    phi = float(jnp.abs(sol.phi).max())
    headline = (
        f"The slider-crank runs its second with max |Φ| = {phi:.1e} (Baumgarte, "
        "kd = 20, kp = 100); the animation traces the rod's centre."
    )
    print(headline)
    figures = [
        figure(
            folder / "slider_crank.png",
            "slider position against crank angle, and the largest constraint violation over time",
        )
    ]
    if not quick:
        figures.append(
            figure(
                folder / "slider_crank.mp4",
                "animation (MP4, a quarter of real speed), with the path of the rod's centre",
            )
        )
    figures.append(figure(folder / "slider_crank.gif", "the same animation as a small GIF"))
    return dict(headline=headline, table=[], figures=figures)


if __name__ == "__main__":
    args = parse_args(NAME, __doc__.splitlines()[0])
    main(args.out, args.quick)
