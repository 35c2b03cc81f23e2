"""Time stepping of contacts with friction (`jaxdae.TimeStepping`): a batch of balls or
boxes.

The scenes, in a spatial `Mechanism` with `Baumgarte(20, 100)` on the quaternion's unit
norm, dropped from 0.3 m with a horizontal velocity and a spin onto the ground:

- `ball` (default): a uniform sphere (radius 0.1 m, 1 kg), one `PlaneContact` with
    restitution 0.5 and Coulomb friction `μ`: it bounces, slides and rolls;
- `box`: a 0.2 m cube (1 kg), a plastic `PlaneContact` with friction `μ` at each of its
    8 corners: it lands on an edge or a corner, tips and comes to rest on a face, with up
    to 4 contacts closed at once.

One trajectory per member, `jax.vmap(jaxdae.simulate)` over the launch velocity and `μ`
(from 0.1 to 0.8), 1 s in steps of `--dt` (default 1 ms). With `--events`, the same batch
event-driven (`jaxdae.EventDriven`, `rtol=1e-6`, `atol=1e-8`) for comparison.

Printed: the compile time (the first call's) and the trajectories per second of the
compiled batch (median of `--repeats` calls).

    python experiments/benchmarks/bench_time_stepping.py [--scene ball|box] [--batch 256]
        [--dt 1e-3] [--float32] [--events] [--repeats 3]
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxdae  # noqa: E402
import jaxdae.multibody as mb  # noqa: E402

RADIUS = 0.1


def ball(mu):
    """The sphere on the ground with Coulomb's `mu` (an array: traced under `vmap`)."""
    return mb.Mechanism(
        bodies=[
            mb.RigidBody(
                "ball",
                mass=1.0,
                inertia=0.4 * RADIUS**2 * np.eye(3),
                position=[0.0, 0.0, 3 * RADIUS],
            )
        ],
        forces=[mb.Gravity([0.0, 0.0, -9.81])],
        stops=[mb.PlaneContact("ball", radius=RADIUS, restitution=0.5, friction=mu)],
    )


def box(mu):
    """The cube with a contact at each corner (`mu` an array: traced under `vmap`)."""
    half = RADIUS
    corners = {
        f"c{i}": (half * sx, half * sy, half * sz)
        for i, (sx, sy, sz) in enumerate(
            np.array(np.meshgrid([-1, 1], [-1, 1], [-1, 1])).reshape(3, -1).T
        )
    }
    return mb.Mechanism(
        bodies=[
            mb.RigidBody(
                "box",
                mass=1.0,
                inertia=(2 * half) ** 2 / 6 * np.eye(3),
                markers=corners,
                position=[0.0, 0.0, 3 * RADIUS],
                orientation=mb.rotation_matrix((1.0, 2.0, 0.0), 0.4),
            )
        ],
        forces=[mb.Gravity([0.0, 0.0, -9.81])],
        stops=[mb.PlaneContact(f"box.{name}", friction=mu) for name in corners],
    )


SCENES = {"ball": ball, "box": box}


def batch(size: int, dtype, scene=ball):
    """Launch velocities (translation and the quaternion's rate of a spin about `z` and
    `x`) and coefficients of friction of `size` members."""
    rng = np.random.default_rng(0)
    q0, v0 = scene(0.5).initial_state()
    v = np.tile(np.asarray(v0), (size, 1))
    v[:, 0:2] = rng.uniform(-2.0, 2.0, (size, 2))
    # `ṗ = ½ p ⊗ (0, ω)` at the identity `p = (1, 0, 0, 0)`: `(0, ω/2)`.
    v[:, 4] = 0.5 * rng.uniform(-10.0, 10.0, size)
    v[:, 6] = 0.5 * rng.uniform(-10.0, 10.0, size)
    mu = np.linspace(0.1, 0.8, size)
    return jnp.asarray(q0, dtype), jnp.asarray(v, dtype), jnp.asarray(mu, dtype)


def solver(dt: float, events: bool, scene=ball):
    """The batched solve `(q0, v0s, mus) -> final positions`."""

    def one(q0, v0, mu):
        options = (
            {"events": jaxdae.TimeStepping(dt=dt), "max_steps": int(1.5 / dt)}
            if not events
            else {"rtol": 1e-6, "atol": 1e-8, "events": jaxdae.EventDriven(max_events=200)}
        )
        sol = jaxdae.simulate(
            scene(mu), jaxdae.Baumgarte(20.0, 100.0), 0.0, 1.0, q0, v0, throw=False, **options
        )
        return sol.q_final, sol.result == jaxdae.RESULTS.successful

    return jax.jit(jax.vmap(one, in_axes=(None, 0, 0)))


def measure(size: int, dt: float, dtype, events: bool, repeats: int, scene: str) -> None:
    q0, v0, mu = batch(size, dtype, SCENES[scene])
    solve = solver(dt, events, SCENES[scene])
    start = time.perf_counter()
    final, ok = jax.block_until_ready(solve(q0, v0, mu))
    compile_time = time.perf_counter() - start
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(solve(q0, v0, mu))
        runs.append(time.perf_counter() - start)
    run = float(np.median(runs))
    name = "EventDriven" if events else f"TimeStepping(dt={dt:g})"
    print(
        f"{scene:<5} {name:<26} {np.dtype(dtype).name:<8} batch {size:>5}: "
        f"compile {compile_time:6.1f} s, "
        f"run {run:7.3f} s, {size / run:9.1f} trajectories/s, "
        f"{int(np.sum(np.asarray(ok)))}/{size} reached t1, "
        f"final height {float(np.median(np.asarray(final)[:, 2])):.4f} m (median)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scene", choices=sorted(SCENES), default="ball")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dt", type=float, default=1e-3)
    parser.add_argument("--float32", action="store_true")
    parser.add_argument("--events", action="store_true", help="also the event-driven batch")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    dtype = jnp.float32 if args.float32 else jnp.float64
    print(f"{jax.devices()[0].device_kind}, {jax.device_count()} device(s)")
    measure(args.batch, args.dt, dtype, False, args.repeats, args.scene)
    if args.events:
        measure(args.batch, args.dt, dtype, True, args.repeats, args.scene)


if __name__ == "__main__":
    main()
