"""A slider-crank from nothing to a plotted trajectory with `jaxdae.multibody`.

A crank (0.1 m, turning about its centre of mass), a connecting rod (0.3 m) and a slider on
the x axis, under gravity, started at a crank angle of 0.5 rad turning at 10 rad/s; simulated
for 1 s with Baumgarte stabilization. The figure shows the slider's position against the
crank angle and the largest constraint violation over time. The model, the simulation and the
plot are the 15 lines between the markers below.

    python experiments/examples/slider_crank.py [--out output]   # writes OUT/slider_crank/slider_crank.png
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: _common

import jax.numpy as jnp
import matplotlib.pyplot as plt
from _common import output_dir, parse_args

import jaxdae
import jaxdae.multibody as mb

out = output_dir(parse_args("slider_crank", __doc__.splitlines()[0]).out, "slider_crank")
# --- user code: model, simulation, plot ---
crank = mb.PlanarBody("crank", mass=1.0, inertia=2e-3, markers={"pin": (0.1, 0.0)})
rod = mb.PlanarBody("rod", mass=0.5, inertia=4e-3, markers={"a": (-0.15, 0.0), "b": (0.15, 0.0)},
                     position=(0.25, 0.0))
slider = mb.PlanarBody("slider", mass=0.3, inertia=1e-4, position=(0.4, 0.0))
joints = [mb.Revolute("ground", "crank", name="crank"), mb.Revolute("crank.pin", "rod.a"),
          mb.Revolute("rod.b", "slider"), mb.Prismatic("ground", "slider", name="slide")]
model = mb.Mechanism([crank, rod, slider], joints, [mb.Gravity()])
q0, v0 = model.initial_state(joint_coordinates={"crank": (0.5, 10.0)})
sol = jaxdae.simulate(model, jaxdae.Baumgarte(20.0, 100.0), 0.0, 1.0, q0, v0,
                      ts=jnp.linspace(0.0, 1.0, 501))
c = model.joint_coordinates(sol.q)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
ax1.plot(c["crank"], c["slide"]), ax1.set(xlabel="crank angle [rad]", ylabel="slider x [m]")
ax2.semilogy(sol.ts, abs(sol.phi).max(1)), ax2.set(xlabel="t [s]", ylabel="max |Φ| [m, rad]")
fig.savefig(out / "slider_crank.png", dpi=120)
# --- end of user code ---
print(f"max |Φ| = {float(jnp.abs(sol.phi).max()):.1e}; wrote {out / 'slider_crank.png'}")
