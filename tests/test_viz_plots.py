"""`Solution.plot` / `jaxdae.viz.plot_solution`: the panels of every kind of solution, batches
as lines or a percentile band, events, masking of failed rows, and matplotlib kept out of
`import jaxdae`."""

import subprocess
import sys

import pytest

pytest.importorskip("matplotlib", reason="plots need the viz extra (matplotlib)")

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402
import numpy as np  # noqa: E402

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import LineCollection, PolyCollection  # noqa: E402

import jaxdae  # noqa: E402
import jaxdae.multibody as mb  # noqa: E402
from jaxdae import examples  # noqa: E402
from jaxdae.viz import plot_solution  # noqa: E402

# Tiny solves: the plots are under test, not the accuracy.
T1 = 1.0
TS = jnp.linspace(0.0, T1, 21)
LOOSE = {"rtol": 1e-5, "atol": 1e-7}
Q = "coordinates q"
V = "velocities v"
VIOLATIONS = "constraint violation\n(largest entry)"
ENERGY = r"energy drift $E - E(t_0)$"
MULTIPLIERS = "multipliers"
PENDULUM = examples.CartesianPendulum()
STABLE = jaxdae.Baumgarte(20.0, 100.0)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _pendulum(angle):
    return jaxdae.simulate(
        PENDULUM, STABLE, 0.0, T1, *PENDULUM.state_from_angle(angle, 0.0), ts=TS, **LOOSE
    )


# The batch's angles, 0.5 among them: the single solve is that member of the batch, so the
# pendulum compiles once (a batched solve), not once more as a solve of its own.
ANGLES = jnp.linspace(0.3, 0.6, 40)
ONE = 26  # ANGLES[26] = 0.5


@pytest.fixture(scope="module")
def batch():
    """40 pendulums from `jax.vmap(jaxdae.simulate)`."""
    return jax.vmap(_pendulum)(ANGLES)


@pytest.fixture(scope="module")
def pendulum(batch):
    """The pendulum started at 0.5 rad: one member of `batch`, a single solve's `Solution`."""
    return jax.tree.map(lambda x: x[ONE], batch)


@pytest.fixture(scope="module")
def ball():
    return jaxdae.simulate(
        examples.BouncingBall(),
        jaxdae.Unstabilized(),
        0.0,
        T1,
        jnp.array([0.0, 1.0]),
        jnp.zeros(2),
        ts=TS,
        **LOOSE,
    )


@pytest.fixture(scope="module")
def optics():
    system = examples.AdaptiveOpticsElement()
    control = jaxdae.ConstraintEnforcingControl.with_poles(10.0, order=4)
    return jaxdae.simulate_actuated(
        system, control, 0.0, T1, *system.initial_state(angle_error=0.05), ts=TS, **LOOSE
    )


def _panels(fig, ylabels):
    """The figure has exactly these panels, each with lines of some finite data and none
    of non-finite data other than NaN (left out by matplotlib)."""
    assert [ax.get_ylabel() for ax in fig.axes] == list(ylabels)
    assert fig.axes[-1].get_xlabel() == "time t"
    for ax in fig.axes:
        assert ax.lines, ax.get_ylabel()
        for line in ax.lines:
            y = np.asarray(line.get_ydata(), dtype=float)
            assert np.any(np.isfinite(y)) and not np.any(np.isinf(y)), ax.get_ylabel()
    return {ax.get_ylabel(): ax for ax in fig.axes}


def _legend(ax):
    return [text.get_text() for text in ax.get_legend().get_texts()]


def test_import_jaxdae_leaves_matplotlib_out():
    code = (
        "import sys, jaxdae, jaxdae.viz._plots; "
        "assert 'matplotlib' not in sys.modules, 'matplotlib was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_holonomic_solution(pendulum):
    fig = pendulum.plot()
    panels = _panels(fig, (Q, VIOLATIONS, ENERGY, MULTIPLIERS))
    assert len(panels[Q].lines) == 2 and _legend(panels[Q]) == ["$q_{0}$", "$q_{1}$"]
    assert panels[VIOLATIONS].get_yscale() == "log"
    assert _legend(panels[VIOLATIONS]) == [r"$|\Phi|$", r"$|\dot\Phi|$"]
    assert len(panels[ENERGY].lines) == 1
    drift = panels[ENERGY].lines[0].get_ydata()
    assert drift[0] == 0.0 and np.max(np.abs(drift)) < 1e-3
    assert _legend(panels[MULTIPLIERS]) == [r"$\lambda_{0}$"]
    assert fig._suptitle is None  # a successful single solve needs no note


def test_fields_names_and_axes(pendulum):
    fig = pendulum.plot(fields=("q", "v"), names=("x", "y"), title="pendulum")
    panels = _panels(fig, (Q, V))
    assert _legend(panels[Q]) == _legend(panels[V]) == ["x", "y"]
    np.testing.assert_allclose(panels[V].lines[0].get_ydata(), np.asarray(pendulum.v[:, 0]))
    assert fig._suptitle.get_text() == "pendulum"

    figure, axes = plt.subplots(1, 2)
    assert plot_solution(pendulum, fields=["energy", "q"], axes=axes) is figure
    assert [ax.get_ylabel() for ax in axes] == [ENERGY, Q]


@pytest.mark.slow
def test_mechanism_coordinate_names():
    """`names=mechanism.coordinate_names` labels the coordinates of a multibody model."""
    model = mb.Mechanism(
        bodies=[
            mb.PlanarBody(
                "bob", mass=1.0, inertia=0.01, markers={"top": (-0.5, 0.0)}, position=(0.5, 0.0)
            )
        ],
        joints=[mb.Revolute("ground", "bob.top", name="pivot")],
        forces=[mb.Gravity((0.0, -9.81))],
    )
    q0, v0 = model.initial_state(joint_coordinates={"pivot": (0.0, 1.0)})
    sol = jaxdae.simulate(model, STABLE, 0.0, 0.2, q0, v0, ts=jnp.linspace(0.0, 0.2, 5), **LOOSE)
    panels = _panels(sol.plot(names=model.coordinate_names), (Q, VIOLATIONS, ENERGY, MULTIPLIERS))
    assert _legend(panels[Q]) == ["bob.x", "bob.y", "bob.theta"]


def test_events_are_marked(ball):
    """An unconstrained system with impacts: no violation or multiplier panels, and the
    impacts as vertical lines on every panel, named once."""
    panels = _panels(ball.plot(), (Q, ENERGY))
    impacts = np.asarray(ball.events.t[: int(ball.events.count)])
    assert len(impacts) >= 1
    for ax in panels.values():
        markers = [c for c in ax.collections if isinstance(c, LineCollection)]
        assert len(markers) == 1
        drawn = sorted(segment[0, 0] for segment in markers[0].get_segments())
        np.testing.assert_allclose(drawn, impacts)
    assert _legend(panels[Q]) == ["$q_{0}$", "$q_{1}$", "impact"]
    assert len(ball.plot(events=False).axes[0].collections) == 0


def test_nonholonomic_solution():
    sleigh = examples.ChaplyginSleigh()
    sol = jaxdae.simulate(sleigh, STABLE, 0.0, T1, *sleigh.initial_state(1.0, 1.0), ts=TS, **LOOSE)
    panels = _panels(sol.plot(), (Q, VIOLATIONS, ENERGY, MULTIPLIERS))
    assert len(panels[Q].lines) == 3
    assert _legend(panels[VIOLATIONS]) == [r"$|\Psi|$"]
    assert _legend(panels[MULTIPLIERS]) == [r"$\mu_{0}$"]


def test_small_batch_as_lines(batch):
    three = jax.tree.map(lambda x: x[:3], batch)
    assert three.ts.shape == (3, len(TS))
    panels = _panels(three.plot(), (Q, VIOLATIONS, ENERGY, MULTIPLIERS))
    assert len(panels[Q].lines) == 3 * 2  # a line per member and coordinate
    assert len(panels[ENERGY].lines) == 3
    assert not any(isinstance(c, PolyCollection) for ax in panels.values() for c in ax.collections)


def test_large_batch_as_band(batch):
    fig = batch.plot(percentiles=(10, 90))
    panels = _panels(fig, (Q, VIOLATIONS, ENERGY, MULTIPLIERS))
    for ax in panels.values():
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert len(bands) == len(ax.lines) >= 1  # a median and its band per series
    median = panels[Q].lines[0].get_ydata()
    np.testing.assert_allclose(median, np.median(np.asarray(batch.q[:, :, 0]), axis=0))
    assert "10–90 percentile band of 40 solves" in fig._suptitle.get_text()
    # The same with save times shared by the batch, `(N,)`.
    shared = eqx.tree_at(lambda s: s.ts, batch, TS)
    _panels(shared.plot(), (Q, VIOLATIONS, ENERGY, MULTIPLIERS))


def test_rows_after_a_failure_are_left_out(batch):
    """A member whose rows turn `inf` (as after a failure) is drawn up to there, and the
    title says that it failed."""
    three = jax.tree.map(lambda x: x[:3], batch)
    cut = jnp.arange(len(TS)) >= 10

    def fail(x):
        return jnp.where(cut.reshape((-1,) + (1,) * (x.ndim - 2)), jnp.inf, x[1])

    failed = eqx.tree_at(
        lambda s: (s.q, s.phi, s.dphi, s.multipliers, s.energy),
        three,
        replace_fn=lambda x: x.at[1].set(fail(x)),
    )
    result = jax.vmap(
        lambda ok: jaxdae.RESULTS.where(ok, jaxdae.RESULTS.successful, jaxdae.RESULTS.diverged)
    )(jnp.array([True, False, True]))
    failed = eqx.tree_at(lambda s: s.result, failed, result)
    fig = failed.plot()
    panels = _panels(fig, (Q, VIOLATIONS, ENERGY, MULTIPLIERS))
    member = np.asarray(panels[Q].lines[1].get_ydata(), dtype=float)
    assert np.all(np.isfinite(member[:10])) and np.all(np.isnan(member[10:]))
    assert "1 of 3 solves failed" in fig._suptitle.get_text()


def test_actuated_solution(optics):
    panels = _panels(
        optics.plot(), (Q, "actuator states w", "inputs u", "program constraints\n(largest entry)")
    )
    assert len(panels[Q].lines) == 1 and len(panels["actuator states w"].lines) == 2
    assert len(panels["inputs u"].lines) == 1
    violations = panels["program constraints\n(largest entry)"]
    assert violations.get_yscale() == "log"
    assert _legend(violations) == ["$|f|$", r"$|\dot f|$", r"$|\ddot f|$", "$|f^{(3)}|$"]


def test_bad_arguments(unchecked, pendulum, ball, optics):
    with pytest.raises(ValueError, match="Unknown field"):
        pendulum.plot(fields=("q", "w"))
    with pytest.raises(ValueError, match="no constraints"):
        ball.plot(fields=("violations",))
    with pytest.raises(ValueError, match="sequence of 2 strings"):
        pendulum.plot(names=("x",))
    with pytest.raises(ValueError, match="one axes per panel"):
        pendulum.plot(axes=plt.subplots(1, 2)[1])
    with pytest.raises(ValueError, match="percentiles"):
        pendulum.plot(percentiles=(95, 5))
    with pytest.raises(TypeError, match="jaxdae.Solution"):
        plot_solution(pendulum.q)
    _panels(optics.plot(fields="v"), (V,))


def test_missing_matplotlib_names_the_extra(pendulum, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r"pip install jaxdae\[viz\]"):
        pendulum.plot()


def _solve(system, formulation, q0, v0, t1=T1, **kwargs):
    return jaxdae.simulate(
        system, formulation, 0.0, t1, q0, v0, ts=jnp.linspace(0.0, t1, 21), **LOOSE, **kwargs
    )


def _ball_and_beam():
    model = examples.BallAndBeam(exact=True)
    return (
        _solve(
            model, jaxdae.RedundantCoordinates(dependent=model.dependent), *model.state(0.4, 0.1)
        ),
        model.coordinate_names,
    )


def _arm(system):
    return _solve(system, STABLE, *examples.CartesianArm().initial_state())


# Every example system not covered above, with the panels its plot should have.
_EXAMPLES = {
    "PendulumWithStop": (
        lambda: _solve(
            examples.PendulumWithStop(), STABLE, *examples.PendulumWithStop().initial_state(0.8)
        ),
        (Q, VIOLATIONS, ENERGY, MULTIPLIERS),
    ),
    "SlidingBlock": (
        lambda: _solve(
            examples.SlidingBlock(), jaxdae.Unstabilized(), jnp.zeros(2), jnp.array([1.0, 0.0])
        ),
        (Q, ENERGY),
    ),
    "RockingBlock": (
        lambda: _solve(
            examples.RockingBlock(),
            jaxdae.Unstabilized(),
            *examples.RockingBlock().initial_state(0.1),
        ),
        (Q, ENERGY),
    ),
    "WoodpeckerToy": (
        lambda: _solve(
            examples.WoodpeckerToy(),
            jaxdae.Unstabilized(),
            *examples.WoodpeckerToy().published_state(),
            t1=0.05,
        ),
        (Q, ENERGY),
    ),
    "KnifeEdge": (
        lambda: _solve(examples.KnifeEdge(), STABLE, jnp.zeros(3), jnp.array([0.0, 0.0, 1.0])),
        (Q, VIOLATIONS, ENERGY, MULTIPLIERS),
    ),
    "TwoLinkManipulator": (
        lambda: _solve(
            examples.TwoLinkManipulator(),
            jaxdae.ModifiedLagrange(10.0, [20.0, 10.0], [100.0, 25.0]),
            *examples.TwoLinkManipulator().initial_state(),
        ),
        (Q, VIOLATIONS, ENERGY, MULTIPLIERS),
    ),
    "CartesianArm": (lambda: _arm(examples.CartesianArm()), (Q, VIOLATIONS, ENERGY, MULTIPLIERS)),
    "CartesianArmLagrangian": (
        lambda: _arm(examples.CartesianArmLagrangian()),
        (Q, VIOLATIONS, ENERGY, MULTIPLIERS),
    ),
    "BallAndBeam": (_ball_and_beam, (Q, VIOLATIONS, ENERGY, MULTIPLIERS)),
    "Crank": (
        lambda: _solve(
            examples.Crank(jnp.array(0.1), jnp.array(0.05), jnp.array(9.81)),
            jaxdae.Unstabilized(),
            jnp.array([0.5]),
            jnp.zeros(1),
        ),
        (Q, ENERGY),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_EXAMPLES))
def test_every_example_plots(name):
    make, ylabels = _EXAMPLES[name]
    made = make()
    sol, names = made if isinstance(made, tuple) else (made, None)
    panels = _panels(sol.plot(names=names), ylabels)
    assert len(panels[Q].lines) == sol.q.shape[-1]
    if names is not None:
        assert _legend(panels[Q]) == list(names)
    if sol.events is not None and int(sol.events.count):
        assert any(isinstance(c, LineCollection) for c in panels[Q].collections)


def test_exact_residuals_stay_on_a_linear_axis(pendulum):
    """Residuals that are exactly zero throughout have no log axis to go on."""
    exact = eqx.tree_at(lambda s: (s.phi, s.dphi), pendulum, replace_fn=lambda x: jnp.zeros_like(x))
    violations = _panels(exact.plot(), (Q, VIOLATIONS, ENERGY, MULTIPLIERS))[VIOLATIONS]
    assert violations.get_yscale() == "linear"


def _has_combining(text: str) -> bool:
    return any(0x300 <= ord(c) <= 0x36F for c in text)


@pytest.mark.parametrize("name", ["pendulum", "ball", "optics"])
def test_labels_are_distinct_and_render_in_the_default_font(name, request):
    """Every legend's labels differ, and no text of the figure carries a combining character
    (U+0300–U+036F): the default font draws `Φ̇` as `Φ`, so a derivative is written in
    mathtext (`$|\\dot\\Phi|$`)."""
    sol = request.getfixturevalue(name)
    fig = sol.plot()
    fig.canvas.draw()  # every label parses as mathtext
    for ax in fig.axes:
        labels = _legend(ax) if ax.get_legend() is not None else []
        assert len(set(labels)) == len(labels), (ax.get_ylabel(), labels)
        texts = labels + [ax.get_ylabel(), ax.get_xlabel(), ax.get_title()]
        assert not [t for t in texts if _has_combining(t)], texts
    assert not _has_combining(fig._suptitle.get_text() if fig._suptitle else "")
