"""`jaxdae.ReverseSweepAdjoint` (the default adjoint of explicit Runge–Kutta solvers) gives
diffrax's `RecursiveCheckpointAdjoint`'s gradients, all steps stored or in segments, in
`simulate` and as the adjoint of a `diffrax.diffeqsolve` of one's own."""

import dataclasses
import functools
import subprocess
import sys
from pathlib import Path

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
import pytest

import jaxdae
from jaxdae.examples import CartesianPendulum, TwoLinkManipulator

from ._jaxprs import batch_indexed_in_loops, equations
from ._systems import Bead

PENDULUM = CartesianPendulum()
CHECKPOINTED = diffrax.RecursiveCheckpointAdjoint()
# A few steps at once: the solves below run in several segments, re-solved from checkpoints.
SEGMENTED = jaxdae.ReverseSweepAdjoint(stored_steps=16)
Q0, V0 = PENDULUM.state_from_angle(0.6, -0.5)


def _gradients(loss, adjoint, *args):
    return jax.jit(jax.grad(lambda *a: loss(*a, adjoint), argnums=tuple(range(len(args)))))(*args)


def _assert_same(reference, swept, rtol=1e-11):
    """Equal to `rtol`, entries much smaller than their leaf's largest to `rtol` of that."""
    for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(swept), strict=True):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=rtol * (1 + float(jnp.max(jnp.abs(a)))))


@pytest.mark.slow
def test_same_gradient_as_the_default_adjoint():
    """Adaptive Tsit5, states saved inside steps (through the dense output) and at the end,
    the diagnostics, a formulation that can stop: gradients with respect to the gains, the
    system's parameters and the initial state."""
    ts = jnp.linspace(0.0, 1.5, 7)

    def loss(system, formulation, q0, v0, adjoint):
        sol = jaxdae.simulate(
            system, formulation, 0.0, 1.5, q0, v0, ts=ts, adjoint=adjoint, max_steps=2048
        )
        return (
            jnp.sum(sol.q**2)
            + jnp.sum(jnp.sin(sol.v))
            + jnp.sum(sol.multipliers)
            + 10 * jnp.sum(sol.phi**2)
            + jnp.sum(sol.q_final**3)
        )

    args = (PENDULUM, jaxdae.Baumgarte(10.0, 25.0), 1.05 * Q0, V0)
    grad = lambda adjoint: eqx.filter_jit(  # noqa: E731
        eqx.filter_grad(lambda diff: loss(*diff, adjoint))
    )(args)
    reference, swept, segmented = (
        grad(adjoint)
        for adjoint in (CHECKPOINTED, jaxdae.ReverseSweepAdjoint(stored_steps=2048), SEGMENTED)
    )
    _assert_same(reference, swept)
    _assert_same(reference, segmented)
    assert float(jnp.abs(swept[1].kd)) > 0 and float(jnp.abs(swept[0].length)) > 0


class _Swings(jaxdae.LagrangianSystem):
    """Ten uncoupled pendulums in their angles: no constraints, structured terms (above 8
    coordinates), whose failure test is the constant `False`."""

    def kinetic_energy(self, t, q, v):
        return 0.5 * jnp.sum(v**2)

    def potential_energy(self, t, q):
        return -jnp.sum(jnp.cos(q))


@pytest.mark.slow
def test_segmented_gradient_without_constraints():
    """A formulation that can stop, on a system without constraints (its failure test a
    Python `False`): the segmented sweep's gradient equals diffrax's."""
    q0 = jnp.linspace(-0.5, 0.5, 10)

    def loss(v0, adjoint):
        sol = jaxdae.simulate(
            _Swings(),
            jaxdae.Baumgarte(10.0, 25.0),
            0.0,
            3.0,
            q0,
            v0,
            adjoint=adjoint,
            max_steps=512,
        )
        return jnp.sum(sol.q_final**2)

    v0 = jnp.linspace(0.3, -0.2, 10)
    _assert_same(*(_gradients(loss, adjoint, v0) for adjoint in (CHECKPOINTED, SEGMENTED)))


@pytest.mark.slow  # two more programs; the default run traces this backward pass (test_references)
def test_a_loss_on_some_diagnostics_gets_their_gradient():
    """The diagnostics at the saved states are differentiated only in the outputs a loss
    reads (`reverse_diagnostics`): a loss on the multipliers and the energy, not on `phi`,
    gets their gradient (central differences)."""
    ts = jnp.linspace(0.0, 0.3, 3)

    def loss(gains):
        sol = jaxdae.simulate(
            PENDULUM, jaxdae.Baumgarte(*gains), 0.0, 0.3, 1.05 * Q0, V0, ts=ts, rtol=1e-11
        )
        return jnp.sum(sol.multipliers**2) + jnp.sum(jnp.sin(sol.energy))

    gains, step = jnp.array([10.0, 25.0]), 1e-5
    value = jax.jit(loss)
    differences = [
        (value(gains.at[i].add(step)) - value(gains.at[i].add(-step))) / (2 * step)
        for i in range(2)
    ]
    gradient = jax.jit(jax.grad(loss))(gains)
    assert np.all(np.abs(gradient) > 1e-3)
    np.testing.assert_allclose(gradient, differences, rtol=1e-6)


def _residuals_loss(sol):
    return jnp.sum(sol.phi**2) + jnp.sum(jnp.sin(sol.dphi)) + jnp.sum(sol.psi**3)


def _energy_loss(sol):
    return jnp.sum(jnp.sin(sol.energy)) + jnp.sum(sol.v**2) + jnp.sum(sol.p**3)


@pytest.mark.slow  # eight gradient programs
@pytest.mark.parametrize(
    "read", [_residuals_loss, _energy_loss], ids=["residuals", "energy, velocities, momenta"]
)
def test_a_loss_on_what_the_model_functions_give_skips_the_terms(read, monkeypatch):
    """A loss that reads only what the system's own functions give (`phi`, `dphi`, `psi`
    from `constraints` and `velocity_constraints`, where its terms take them from these;
    the energy; the velocities; the momenta) linearizes only those functions in the
    backward pass, not the terms: the same gradient as the backward pass through the terms,
    from a shorter program; for holonomic and nonholonomic constraints."""
    from jaxdae._integration import _diagnostics

    sleigh = jaxdae.examples.ChaplyginSleigh()
    ts = jnp.linspace(0.0, 0.3, 4)
    sleigh_q0, sleigh_v0 = sleigh.initial_state(1.0, 0.5)
    # Starts off the constraints, so that the residuals and their gradients are not zero.
    starts = ((1.05 * Q0, V0), (sleigh_q0, sleigh_v0 + jnp.array([0.05, -0.03, 0.0])))
    for system, (q0, v0) in zip((PENDULUM, sleigh), starts, strict=True):

        def loss(gains, v0, system=system, q0=q0):
            sol = jaxdae.simulate(
                system, jaxdae.Baumgarte(*gains), 0.0, 0.3, q0, v0, ts=ts, rtol=1e-10, atol=1e-12
            )
            return read(sol)

        args = (jnp.array([5.0, 5.0]), v0)
        grad = jax.grad(loss, argnums=(0, 1))
        alone = jax.jit(grad)(*args)
        size_alone = len(list(equations(jax.make_jaxpr(grad)(*args).jaxpr)))
        # The same system as a class of its own, so that JAX traces its solve anew (its
        # caches hold the transposed programs), with the backward pass through the terms.
        same = type("Same", (type(system),), {})(
            **{f.name: getattr(system, f.name) for f in dataclasses.fields(system)}
        )
        grad_same = jax.grad(functools.partial(loss, system=same), argnums=(0, 1))
        with monkeypatch.context() as patched:
            patched.setattr(_diagnostics, "read_from_functions", lambda *_: False)
            through_terms = jax.jit(grad_same)(*args)
            size_through_terms = len(list(equations(jax.make_jaxpr(grad_same)(*args).jaxpr)))
        assert all(np.abs(x).max() > 1e-6 for x in alone)
        for a, b in zip(alone, through_terms, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-14)
        assert size_alone < size_through_terms


def test_segments_take_the_solves_steps():
    """In segments, each restarted from the solve's `t0` (`Restart`), reverse mode's
    forward solve takes the steps of diffrax's uninterrupted solve (the primal): the same
    step counts and, up to XLA's rounding of another program, the same states. A
    controller with jump times (its state carried across restarts), saves at `ts`, a
    formulation that can stop. (No segment here starts right after a jump: see
    `test_segment_starting_after_a_jump`.)"""
    ts = jnp.linspace(0.0, 1.5, 7)
    controller = diffrax.ClipStepSizeController(
        diffrax.PIDController(rtol=1e-8, atol=1e-10), jump_ts=jnp.array([0.3, 0.77])
    )

    def solve(kd):
        return jaxdae.simulate(
            PENDULUM,
            jaxdae.Baumgarte(kd, 25.0),
            0.0,
            1.5,
            1.05 * Q0,
            V0,
            ts=ts,
            stepsize_controller=controller,
            adjoint=SEGMENTED,
            max_steps=2048,
        )

    plain = jax.jit(solve)(10.0)
    segmented = jax.jit(lambda kd: jax.vjp(solve, kd)[0])(10.0)
    assert int(plain.stats["num_accepted_steps"]) > 3 * SEGMENTED.stored_steps
    for key in ("num_steps", "num_accepted_steps", "num_rejected_steps"):
        assert int(segmented.stats[key]) == int(plain.stats[key]), key
    assert segmented.result == plain.result
    _assert_same(
        (plain.q, plain.v, plain.q_final, plain.v_final),
        (segmented.q, segmented.v, segmented.q_final, segmented.v_final),
        rtol=1e-13,
    )


def _van_der_pol_end(mu, adjoint):
    return diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, mu: jnp.stack([y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]])),
        diffrax.Tsit5(),
        0.0,
        1.0,
        None,
        jnp.array([2.0, 0.0]),
        args=mu,
        stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8),
        max_steps=64,
        adjoint=adjoint,
    ).ys[-1, 0]


def _generalized_alpha_end(kp):
    return jaxdae.simulate(
        PENDULUM,
        jaxdae.Baumgarte(5.0, kp),
        0.0,
        1.0,
        jnp.array([1.0, 0.0]),
        jnp.full(2, 0.1 * kp),
        solver=jaxdae.GeneralizedAlpha(),
        max_steps=64,
    ).q_final[0]


@pytest.mark.parametrize(
    "loss, depth",
    [
        # The sweep's steps run inside its loop over segments (the segment loop itself
        # re-solves with diffrax, whose saving reads per-member positions).
        pytest.param(lambda mu: _van_der_pol_end(mu, SEGMENTED), 2, id="ReverseSweepAdjoint"),
        pytest.param(
            lambda mu: _van_der_pol_end(mu, jaxdae.ReplayAdjoint(stored_steps=16)),
            1,
            id="ReplayAdjoint",
        ),
        pytest.param(_generalized_alpha_end, 1, id="GeneralizedAlphaAdjoint"),
    ],
)
def test_batched_gradients_keep_loop_counters_unbatched(loss, depth):
    """Under `vmap` the members take different numbers of steps, and the backward passes'
    loops run to the batch's largest: their stored states and step times are read and
    written at unbatched counters, never at per-member positions (gathers and scatters,
    which keep XLA:CPU from compiling a loop as one kernel and made batched gradients
    about twice as slow). The gradients themselves are checked under `vmap` in the slow
    tier (`test_vmap_over_solves_with_different_segment_counts` and its kin)."""
    batch = 7  # no other dimension of these solves has this size
    jaxpr = jax.make_jaxpr(jax.vmap(jax.grad(loss)))(jnp.linspace(1.0, 8.0, batch)).jaxpr
    assert batch_indexed_in_loops(jaxpr, batch, depth) == []


@pytest.mark.slow  # the default run keeps segments under `vmap` (the compile test below)
def test_vmap_over_solves_with_different_segment_counts():
    """Under `vmap` the backward pass's segment loop runs as long as the trajectory with the
    most segments: one solved in a single segment (its stored steps swept before the loop,
    which then re-solves a segment whose result it does not use) gets its own gradient
    beside one re-solved from three checkpoints."""

    def loss(kd, t1, adjoint):
        sol = jaxdae.simulate(
            PENDULUM,
            jaxdae.Baumgarte(kd, 25.0),
            0.0,
            t1,
            1.05 * Q0,
            V0,
            adjoint=adjoint,
            max_steps=2048,
        )
        return jnp.sum(sol.q_final**2) + jnp.sum(sol.phi[-1] ** 2)

    t1s = jnp.array([0.05, 1.0])
    steps = jax.jit(
        jax.vmap(
            lambda t1: jaxdae.simulate(
                PENDULUM, jaxdae.Baumgarte(10.0, 25.0), 0.0, t1, 1.05 * Q0, V0, max_steps=2048
            ).stats["num_accepted_steps"]
        )
    )(t1s)
    assert int(steps[0]) < SEGMENTED.stored_steps < 3 * SEGMENTED.stored_steps < int(steps[1])
    reference, segmented = (
        jax.jit(jax.vmap(jax.grad(lambda kd, t1, a=adjoint: loss(kd, t1, a)), in_axes=(None, 0)))(
            10.0, t1s
        )
        for adjoint in (CHECKPOINTED, SEGMENTED)
    )
    _assert_same(reference, segmented)


_VMAPPED_SEGMENTS = """
import jax, jax.numpy as jnp
import jaxdae
from jaxdae.examples import CartesianPendulum
system = CartesianPendulum()
q0, v0 = system.state_from_angle(0.6, -0.5)
def loss(kd):
    sol = jaxdae.simulate(system, jaxdae.Baumgarte(kd, kd), 0.0, 0.5, q0, v0,
                          adjoint=jaxdae.ReverseSweepAdjoint(stored_steps=16), max_steps=256)
    return jnp.sum(sol.q_final ** 2)
print(jax.jit(jax.vmap(jax.grad(loss)))(jnp.array([5.0, 20.0])))
"""


@pytest.mark.slow
def test_vmapped_segments_compile_without_xla_errors():
    """`jit(vmap(grad))` of a solve in segments compiles without XLA's "Algebraic simplifier
    is likely stuck in a circular simplification loop" errors on standard error (a `t1`
    batched inside the backward pass's loop would send XLA's simplifier through diffrax's
    chain of 100 `prevbefore`s of it). XLA writes them from C++, so the program runs in a
    child process whose standard error is read."""
    child = subprocess.run(
        [sys.executable, "-c", _VMAPPED_SEGMENTS],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).parent.parent,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert "circular simplification" not in child.stderr, child.stderr[-3000:]


class _Pushed(CartesianPendulum):
    """The pendulum pushed sideways from `t = 0.3` on: a right-hand side that jumps there."""

    def generalized_forces(self, t, q, v):
        return jnp.where(t >= 0.3, 4.0, 0.0) * jnp.array([1.0, 0.0], q.dtype)


@pytest.mark.slow
def test_segment_starting_after_a_jump():
    """A segment that starts right after a step clipped to a jump time (`jump_ts`) restores
    diffrax's `made_jump`, so its first step evaluates the right-hand side after the jump
    instead of reusing the last stage from before it (first same as last). Dropping the
    flag changed the step counts (68/23 accepted/rejected against 64/11) and the final
    state by 3e-7, checked by hand."""
    q0, v0 = _Pushed().state_from_angle(0.6, -0.5)
    controller = diffrax.ClipStepSizeController(
        diffrax.PIDController(rtol=1e-8, atol=1e-10), jump_ts=jnp.array([0.3])
    )

    def solve(kd, t1, adjoint=None):
        return jaxdae.simulate(
            _Pushed(),
            jaxdae.Baumgarte(kd, 25.0),
            0.0,
            t1,
            q0,
            v0,
            stepsize_controller=controller,
            adjoint=adjoint,
            max_steps=4096,
        )

    # The steps up to the jump (diffrax clips the last one to end just before it) make the
    # first segment.
    before = jax.jit(lambda kd: solve(kd, float(np.nextafter(0.3, 0.0))))(10.0)
    adjoint = jaxdae.ReverseSweepAdjoint(stored_steps=int(before.stats["num_steps"]))
    plain = jax.jit(lambda kd: solve(kd, 1.0, adjoint))(10.0)
    segmented = jax.jit(lambda kd: jax.vjp(lambda k: solve(k, 1.0, adjoint), kd)[0])(10.0)
    assert int(plain.stats["num_steps"]) > int(before.stats["num_steps"])
    for key in ("num_steps", "num_accepted_steps", "num_rejected_steps"):
        assert int(segmented.stats[key]) == int(plain.stats[key]), key
    _assert_same((plain.q_final, plain.v_final), (segmented.q_final, segmented.v_final), rtol=1e-13)


@pytest.mark.slow  # the default run keeps stopped ensemble rows (test_ensemble.py)
def test_ensemble_with_stopped_trajectories():
    """`simulate_ensemble`: one sweep over the shared steps. Two of the four beads reach the
    singular configuration and stop (`Baumgarte`); the sweep holds them still from their
    failure on, as the solve did. States saved inside steps and at the end."""
    ts = jnp.linspace(0.0, 2.0, 21)
    q0 = jnp.stack([jnp.array([1.1, 1.3, 1.8, 2.0]), jnp.zeros(4)], axis=1)

    def loss(kd, kp, q0, adjoint):
        sol = jaxdae.simulate_ensemble(
            Bead(),
            jaxdae.Baumgarte(kd, kp),
            0.0,
            2.0,
            q0,
            jnp.zeros_like(q0),
            ts=ts,
            throw=False,
            adjoint=adjoint,
            max_steps=1024,
        )
        finite = lambda x: jnp.where(jnp.isfinite(x), x, 0.0)  # noqa: E731
        return (
            jnp.sum(finite(sol.q) ** 2) + jnp.sum(finite(sol.multipliers)) + jnp.sum(sol.q_final**3)
        )

    reference, swept, segmented = (
        _gradients(loss, adjoint, 1.0, 25.0, q0)
        for adjoint in (CHECKPOINTED, jaxdae.ReverseSweepAdjoint(), SEGMENTED)
    )
    _assert_same(reference, swept)
    _assert_same(reference, segmented)
    assert np.all(np.abs(swept[2][:, 0]) > 0)  # every trajectory, stopped ones included


@pytest.mark.perf(reason="counts traces of the equations of motion (gradient trace time)")
def test_equations_traced_once():
    """Reverse mode replays `simulate`'s jitted solve; the sweep's forward solve, traced
    lazily there, and the diagnostics' backward pass (the loss reads `phi`) reuse the trace
    of the equations of motion made by the input checks (they traced them a second time
    when the contexts differed): the gradient traces the energies as often as the forward
    solve does."""

    def traces(transform):
        traced = []

        class Counted(CartesianPendulum):  # a new class: in no trace cache
            def kinetic_energy(self, t, q, v):
                traced.append(t)
                return super().kinetic_energy(t, q, v)

        def loss(kd, q0, v0):
            sol = jaxdae.simulate(
                Counted(),
                jaxdae.Baumgarte(kd, 25.0),
                0.0,
                1.0,
                q0,
                v0,
                adjoint=jaxdae.ReverseSweepAdjoint(),
                max_steps=256,
            )
            return jnp.sum(sol.q_final**2) + jnp.sum(sol.phi[-1] ** 2)

        jax.jit(transform(loss)).trace(10.0, Q0, V0)
        return len(traced)

    assert traces(lambda f: jax.grad(f, argnums=(0, 1, 2))) == traces(lambda f: f)


@pytest.mark.perf(reason="counts traces of the equations of motion (forward trace time)")
def test_a_forward_solve_traces_the_terms_once():
    """The steps' scalar graph of the terms, the input checks' shapes and the diagnostics'
    terms outside the steps all re-trace one trace of the system's terms."""
    traced = []

    class Counted(CartesianPendulum):  # a new class: in no trace cache
        def terms(self, t, q, v):
            traced.append(t)
            return super().terms(t, q, v)

    def final(kd, q0, v0):
        return jaxdae.simulate(Counted(), jaxdae.Baumgarte(kd, 25.0), 0.0, 1.0, q0, v0).q_final

    jax.jit(final).trace(10.0, Q0, V0)
    assert len(traced) == 1


@pytest.mark.perf(reason="monkeypatches the private `loop_solve` (gradient trace time)")
def test_reverse_mode_inside_jit_does_not_trace_the_primal_solve(monkeypatch):
    """Staging a jitted call traces a custom VJP's primal solve (diffrax's loop), which
    reverse mode then does not compile (it compiles the sweep's forward solve). The
    gradient inside an enclosing `jax.jit` never traces that primal: `simulate` calls
    `diffrax.diffeqsolve` unjitted (`diffeqsolve_unjitted`), and is itself traced inline
    (`jit_unless_staged`: inside an enclosing jit `simulate` is traced inline; eager calls,
    under `grad` or `vmap` too, run the jitted `simulate`)."""
    from jaxdae._compilation._private_apis import traced_for_jit
    from jaxdae._integration import _sweep_backward

    primal_solves = []
    loop_solve = _sweep_backward.loop_solve
    monkeypatch.setattr(
        _sweep_backward, "loop_solve", lambda *a: primal_solves.append(1) or loop_solve(*a)
    )

    def loss(kd):
        sol = jaxdae.simulate(PENDULUM, jaxdae.Baumgarte(kd, 25.0), 0.0, 1.0, Q0, V0, max_steps=256)
        return jnp.sum(sol.q_final**2)

    jax.jit(jax.grad(loss)).trace(10.0)
    assert primal_solves == []

    staged = []
    probe = lambda x: staged.append(traced_for_jit(x)) or x  # noqa: E731
    for transform, x in (
        (jax.jit, 1.0),
        (jax.grad, 1.0),
        (lambda f: jax.jit(jax.grad(f)), 1.0),
        (jax.vmap, jnp.ones(2)),
        (lambda f: jax.jit(jax.vmap(f)), jnp.ones(2)),
        (lambda f: f, jnp.ones(2)),
    ):
        transform(probe)(x)
    assert staged == [True, False, True, False, True, False]


def test_errors(unchecked):
    sweep = jaxdae.ReverseSweepAdjoint()
    with pytest.raises(ValueError, match="explicit Runge–Kutta.*Kvaerno5"):
        jaxdae.simulate(
            PENDULUM,
            jaxdae.Baumgarte(10.0, 25.0),
            0.0,
            1.0,
            Q0,
            V0,
            solver=diffrax.Kvaerno5(),
            adjoint=sweep,
        )
    with pytest.raises(ValueError, match="integer `max_steps`"):
        jaxdae.simulate(
            PENDULUM, jaxdae.Baumgarte(10.0, 25.0), 0.0, 1.0, Q0, V0, adjoint=sweep, max_steps=None
        )
    for adjoint in (jaxdae.ReverseSweepAdjoint, jaxdae.GeneralizedAlphaAdjoint):
        for bad in (0, 2.5, True):
            with pytest.raises(
                ValueError,
                match=rf"{adjoint.__name__}\(stored_steps=...\)` "
                "must be a positive integer",
            ):
                adjoint(stored_steps=bad)
    # Forward mode through a custom VJP: JAX's TypeError, as a message that names the fix.
    with pytest.raises(ValueError, match=r"needs `adjoint=diffrax.ForwardMode\(\)`"):
        jax.jacfwd(
            lambda kp: (
                jaxdae.simulate(
                    PENDULUM, jaxdae.Baumgarte(10.0, kp), 0.0, 1.0, Q0, V0, max_steps=256
                ).q_final
            )
        )(25.0)


@pytest.mark.slow
def test_resolve_that_takes_other_steps_raises():
    """The backward pass re-solves each earlier segment from its checkpoint and checks that
    it ends where the forward solve's segment did. Here the vector field reads a host value
    that changes between the forward solve and the backward pass, as if the two programs
    had rounded differently enough to take other steps: the gradient raises, naming the
    fix, instead of differentiating steps the solve did not take."""
    rate = {"value": 1.0}

    def vector_field(t, y, k):
        host = jax.pure_callback(
            lambda: np.asarray(rate["value"]), jax.ShapeDtypeStruct((), jnp.float64)
        )
        return -k * host * y + jnp.sin(t)

    def final(k):
        out = diffrax.diffeqsolve(
            diffrax.ODETerm(vector_field),
            diffrax.Tsit5(),
            0.0,
            3.0,
            0.1,
            jnp.array([1.0, 2.0]),
            args=k,
            stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10),
            max_steps=256,
            adjoint=jaxdae.ReverseSweepAdjoint(stored_steps=16),
        )
        return jnp.sum(out.ys[-1] ** 2)

    _, pull = jax.vjp(final, 2.0)
    (unchanged,) = pull(1.0)  # the same steps: no error
    assert np.isfinite(unchanged)
    rate["value"] = 1.5
    with pytest.raises(Exception, match=r"re-solve ended at another time.*stored_steps=max_"):
        jax.block_until_ready(pull(1.0))


@pytest.mark.slow
def test_time_gradients_through_diffrax_loop():
    """The sweep holds the step times constant: gradients with respect to `t0`, `t1` and
    `ts` differentiate diffrax's loop instead, and equal `RecursiveCheckpointAdjoint`'s."""

    def loss(t0, t1, ts, adjoint):
        sol = jaxdae.simulate(
            PENDULUM,
            jaxdae.Baumgarte(10.0, 25.0),
            t0,
            t1,
            Q0,
            V0,
            ts=ts,
            adjoint=adjoint,
            max_steps=256,
        )
        return jnp.sum(sol.q_final**2) + jnp.sum(sol.q[:, 0])

    times = (0.0, 1.0, jnp.array([0.25, 0.5, 1.0]))
    _assert_same(
        *(
            _gradients(loss, adjoint, *times)
            for adjoint in (diffrax.RecursiveCheckpointAdjoint(), jaxdae.ReverseSweepAdjoint())
        )
    )


@pytest.mark.slow  # two more gradient programs; the default test covers the sweep itself
def test_fixed_steps_and_a_stopped_solve():
    """Heun on a constant step with only the end saved; Baumgarte stopping at
    Mukharlyamov and Deressa's (2015) singular configuration (the sweep runs over the steps up
    to the stop)."""

    def loss(kd, kp, q0, adjoint, **options):
        sol = jaxdae.simulate(
            PENDULUM, jaxdae.Baumgarte(kd, kp), 0.0, 1.0, q0, V0, adjoint=adjoint, **options
        )
        return jnp.sum(sol.q_final**2) + jnp.sum(sol.v_final)

    heun = dict(solver=diffrax.Heun(), stepsize_controller=diffrax.ConstantStepSize(), dt0=0.01)
    _assert_same(
        *(
            _gradients(lambda *a: loss(*a, **heun), adjoint, 10.0, 25.0, Q0)
            for adjoint in (CHECKPOINTED, jaxdae.ReverseSweepAdjoint())
        )
    )

    arm = TwoLinkManipulator()
    q0, v0 = arm.initial_state()

    def stopped(kd, kp, q0, adjoint):
        sol = jaxdae.simulate(
            arm,
            jaxdae.Baumgarte(kd, kp),
            0.0,
            2.0,
            q0,
            v0,
            throw=False,
            adjoint=adjoint,
            max_steps=4096,
        )
        return jnp.sum(sol.q_final**2)

    # Near the singular stop rounding is amplified: computing the sweep's stage VJPs as one
    # scalar graph instead of JAX's transpose (equal in exact arithmetic) moved this gradient
    # by 1.2e-4. A step missed or counted twice would move it by O(1).
    gains = (jnp.array([20.0, 10.0]), jnp.array([100.0, 25.0]))
    _assert_same(
        *(
            _gradients(stopped, adjoint, *gains, q0)
            for adjoint in (CHECKPOINTED, jaxdae.ReverseSweepAdjoint())
        ),
        rtol=1e-3,
    )


@pytest.mark.slow  # four more gradient programs
def test_other_solvers_vmap_and_float32():
    """Other tableaus and their dense outputs, `UnrolledERK`, and a float32 batch."""
    ts = jnp.linspace(0.0, 1.0, 5)

    def loss(kp, q0, adjoint, solver, dtype=jnp.float64):
        tol = dict(rtol=1e-5, atol=1e-7) if dtype == jnp.float32 else {}
        sol = jaxdae.simulate(
            PENDULUM,
            jaxdae.ModifiedLagrange(5.0, 10.0, kp),
            0.0,
            1.0,
            q0.astype(dtype),
            V0.astype(dtype),
            ts=ts.astype(dtype),
            solver=solver,
            adjoint=adjoint,
            max_steps=4096,
            **tol,
        )
        return jnp.sum(sol.q**2) + jnp.sum(sol.v[-1])

    for solver in (diffrax.Dopri5(), diffrax.Bosh3(), jaxdae.UnrolledERK(diffrax.Tsit5())):
        _assert_same(
            *(
                _gradients(
                    lambda kp, q, a: loss(kp, q, a, solver),  # noqa: B023
                    adjoint,
                    25.0,
                    1.03 * Q0,
                )
                for adjoint in (CHECKPOINTED, jaxdae.ReverseSweepAdjoint())
            ),
            rtol=1e-10,
        )
    starts = jnp.stack([1.02 * Q0, 1.05 * Q0])
    float32 = [
        jax.jit(
            jax.vmap(
                jax.grad(lambda kp, q, a=adjoint: loss(kp, q, a, diffrax.Tsit5(), jnp.float32)),
                in_axes=(None, 0),
            )
        )(jnp.float32(25.0), starts)
        for adjoint in (CHECKPOINTED, jaxdae.ReverseSweepAdjoint())
    ]
    assert float32[1].dtype == jnp.float32
    np.testing.assert_allclose(float32[1], float32[0], rtol=1e-4)


@pytest.mark.slow
def test_formulation_built_inside_the_differentiated_function():
    """Gains built from Python floats inside the caller's `jit` reach the backward pass as
    typed Python scalars (JAX's literals); the re-solve gets them back as arrays."""

    def loss(system, adjoint):
        formulation = jaxdae.Baumgarte(10.0, 25.0)
        sol = jaxdae.simulate(system, formulation, 0.0, 0.3, Q0, V0, adjoint=adjoint, max_steps=64)
        return jnp.sum(sol.q_final**2)

    def gradient(adjoint):
        return eqx.filter_grad(eqx.filter_jit(lambda s: loss(s, adjoint)))(PENDULUM)

    _assert_same(gradient(CHECKPOINTED), gradient(SEGMENTED))


# A solve of one's own: `diffrax.diffeqsolve(..., adjoint=jaxdae.ReverseSweepAdjoint())`.
def _forced_pendulum(t, y, k):
    return jnp.stack([y[1], -k[0] * jnp.sin(y[0]) - k[1] * y[1] + 0.3 * jnp.cos(2.0 * t)])


class _Field(eqx.Module):
    """A vector field holding an array: its gradient is the term's."""

    coupling: jax.Array

    def __call__(self, t, y, k):
        return _forced_pendulum(t, y, k) + self.coupling * y[::-1]


_PID = diffrax.PIDController(rtol=1e-8, atol=1e-10)
_USER_SOLVES = {  # saveat, step-size controller, (t0, t1)
    "t1, adaptive": (diffrax.SaveAt(t1=True), _PID, (0.0, 3.0)),
    "ts, adaptive": (diffrax.SaveAt(ts=jnp.linspace(0.0, 3.0, 7)), _PID, (0.0, 3.0)),
    "ts, constant steps": (
        diffrax.SaveAt(ts=jnp.linspace(0.01, 2.93, 5)),
        diffrax.ConstantStepSize(),
        (0.0, 3.0),
    ),
    # two `SubSaveAt`s whose save times interleave, solved backwards in time
    "t0, ts and t1, backwards": (
        diffrax.SaveAt(
            subs=[
                diffrax.SubSaveAt(t0=True, ts=jnp.array([2.5, 1.1, 0.2])),
                diffrax.SubSaveAt(ts=jnp.array([2.0, 0.6]), t1=True),
            ]
        ),
        _PID,
        (3.0, 0.0),
    ),
}


# (Saves at `ts` with adaptive steps are also those of the backwards case.)
@pytest.mark.slow
@pytest.mark.parametrize("case", list(_USER_SOLVES))
def test_user_diffeqsolve_same_as_recursive_checkpoint(case):
    """`ReverseSweepAdjoint` as the adjoint of a plain `diffrax.diffeqsolve`: the forward
    solve's values are diffrax's to the bit (plain and under reverse mode), and the
    gradients with respect to `args`, `y0` and the vector field's array equal
    `RecursiveCheckpointAdjoint`'s to 1e-10 relative, all steps stored or in segments."""
    saveat, controller, (t0, t1) = _USER_SOLVES[case]

    def solve(field, k, y0, adjoint):
        return diffrax.diffeqsolve(
            diffrax.ODETerm(field),
            diffrax.Tsit5(),
            t0,
            t1,
            0.05 * np.sign(t1 - t0),
            y0,
            args=k,
            saveat=saveat,
            stepsize_controller=controller,
            max_steps=512,
            adjoint=adjoint,
        )

    def loss(diff, adjoint):
        ys = jax.tree.leaves(solve(*diff, adjoint).ys)
        return sum(jnp.sum(jnp.sin(y) * jnp.arange(1.0, 1.0 + y.size).reshape(y.shape)) for y in ys)

    diff = (_Field(jnp.asarray(0.2)), jnp.array([4.0, 0.3]), jnp.array([1.0, 0.0]))
    results = {}
    for name, adjoint in (
        ("checkpointed", CHECKPOINTED),
        ("swept", jaxdae.ReverseSweepAdjoint()),
        ("segmented", jaxdae.ReverseSweepAdjoint(stored_steps=8)),
    ):
        value_and_grad = eqx.filter_jit(
            eqx.filter_value_and_grad(lambda diff, a=adjoint: loss(diff, a))
        )
        results[name] = value_and_grad(diff)
    plain = eqx.filter_jit(solve)(*diff, jaxdae.ReverseSweepAdjoint())
    reference = eqx.filter_jit(solve)(*diff, CHECKPOINTED)
    assert int(reference.stats["num_steps"]) > 3 * 8  # several segments
    assert int(plain.stats["num_steps"]) == int(reference.stats["num_steps"])
    for a, b in zip(
        jax.tree.leaves((plain.ts, plain.ys)),
        jax.tree.leaves((reference.ts, reference.ys)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    value, gradient = results["checkpointed"]
    for name in ("swept", "segmented"):
        assert float(results[name][0]) == float(value), name
        _assert_same(gradient, results[name][1], rtol=1e-10)
    assert all(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(gradient))


class _Lattice(eqx.Module):
    """A chain of 32 coupled oscillators (a state of 64 entries, enough for the sweep to
    keep each stage's linearization): `ẍ_i = k (x_{i−1} − 2 x_i + x_{i+1}) − sin x_i`."""

    stiffness: jax.Array

    def __call__(self, t, y, damping):
        x, v = y[:32], y[32:]
        padded = jnp.concatenate([jnp.zeros(1), x, jnp.zeros(1)])
        force = self.stiffness * (padded[:-2] - 2 * x + padded[2:]) - jnp.sin(x)
        return jnp.concatenate([v, force - damping * v])


@pytest.mark.slow
def test_sweep_keeps_linearizations_of_larger_states():
    """States of `LINEARIZED_MIN_SIZE` entries or more: the sweep keeps each stage's
    linearization from the stages' recomputation and transposes it on the way back; the
    gradients (saves inside the steps and at the end) are `RecursiveCheckpointAdjoint`'s,
    all steps stored or in segments."""
    from jaxdae._thresholds import LINEARIZED_MIN_SIZE

    saveat, controller, (t0, t1) = _USER_SOLVES["ts, adaptive"]
    y0 = jnp.concatenate([jnp.sin(jnp.arange(32.0)), jnp.zeros(32)])
    assert y0.size >= LINEARIZED_MIN_SIZE

    def loss(diff, adjoint):
        field, damping, y0 = diff
        ys = diffrax.diffeqsolve(
            diffrax.ODETerm(field),
            diffrax.Tsit5(),
            t0,
            t1,
            0.05,
            y0,
            args=damping,
            saveat=saveat,
            stepsize_controller=controller,
            max_steps=256,
            adjoint=adjoint,
        ).ys
        return jnp.sum(jnp.sin(ys) * jnp.arange(1.0, 1.0 + ys.shape[-1]))

    diff = (_Lattice(jnp.asarray(3.0)), jnp.asarray(0.1), y0)
    gradient, swept, segmented = (
        eqx.filter_jit(eqx.filter_grad(lambda diff, a=adjoint: loss(diff, a)))(diff)
        for adjoint in (
            CHECKPOINTED,
            jaxdae.ReverseSweepAdjoint(),
            jaxdae.ReverseSweepAdjoint(stored_steps=16),
        )
    )
    _assert_same(gradient, swept, rtol=1e-10)
    _assert_same(gradient, segmented, rtol=1e-10)


def _flag(t, y, args, **kwargs):
    """Raised once `t` passes the time `args[1][0]` or the angle `y[0]` passes `args[1][1]`
    (traced limits: the tests of either stop share one compiled program)."""
    time, angle = args[1]
    return (t > time) | (y[0] > angle)


def _sign_change(t, y, args, **kwargs):
    """A real value that changes sign at `t = 2.2` (a constant: with a traced time the
    root's rounding differs between the two adjoints' programs)."""
    return 2.2 - t


@eqx.filter_jit
def _stopped_value_and_grad(k, y0, limits, adjoint, condition):
    """The value, `(ts, result)` and gradient w.r.t. `k` and `y0` of the forced pendulum's
    solve that the event `condition` (its limits traced, in `args` beside `k`) stops: one
    program per adjoint and condition."""

    def loss(k, y0):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, args: _forced_pendulum(t, y, args[0])),
            diffrax.Tsit5(),
            0.0,
            3.0,
            0.05,
            y0,
            args=(k, limits),
            saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=_PID,
            event=diffrax.Event(condition),
            max_steps=512,
            adjoint=adjoint,
        )
        return jnp.sum(jnp.sin(sol.ys) * jnp.array([1.0, 2.0])), (sol.ts, sol.result)

    return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(k, y0)


@pytest.mark.parametrize("kind", ["flag", pytest.param("real", marks=pytest.mark.slow)])
def test_event_stops_a_solve_in_segments_as_diffrax(kind):
    """An event (a flag, or a real value that changes sign) that stops a solve in a later
    segment stops it where diffrax's own loop does, with the same values and gradients."""
    condition = _flag if kind == "flag" else _sign_change
    args = (jnp.array([4.0, 0.3]), jnp.array([1.0, 0.0]), jnp.array([2.2, jnp.inf]))
    (value, (ts, result)), gradient = _stopped_value_and_grad(*args, CHECKPOINTED, condition)
    (swept, (swept_ts, swept_result)), swept_gradient = _stopped_value_and_grad(
        *args, jaxdae.ReverseSweepAdjoint(stored_steps=8), condition
    )
    assert result == diffrax.RESULTS.event_occurred and swept_result == result
    # The two programs round differently (on a GPU, or optimized, their event times and
    # values too); compiled at LLVM's level 0, as in the default test run
    # (tests/conftest.py), their gradients here differ by about 1e-9.
    assert 2.2 < float(ts[0]) < 3.0
    np.testing.assert_allclose(swept_ts[0], ts[0], rtol=1e-12)
    np.testing.assert_allclose(swept, value, rtol=1e-12)
    _assert_same(gradient, swept_gradient, rtol=1e-8)


@pytest.mark.parametrize("stored_steps", [8, 1024])
def test_flag_raised_at_the_start_ends_the_solve_there(stored_steps):
    """A flag already true at `t0` ends the solve before its first step, as diffrax's own
    loop does, whether the solve runs in segments or in one: the end is `y0`, so the
    gradient w.r.t. the arguments is zero and w.r.t. `y0` the loss's own."""
    # `y[0] > 0.5`, from `y[0] = 1`; in segments of 8, the program of the test above.
    args = (jnp.array([4.0, 0.3]), jnp.array([1.0, 0.0]), jnp.array([jnp.inf, 0.5]))
    (_, (ts, result)), (k_bar, y0_bar) = _stopped_value_and_grad(
        *args, jaxdae.ReverseSweepAdjoint(stored_steps=stored_steps), _flag
    )
    assert result == diffrax.RESULTS.event_occurred and float(ts[0]) == 0.0
    np.testing.assert_array_equal(k_bar, 0.0)
    np.testing.assert_allclose(y0_bar, [np.cos(1.0), 2.0], rtol=1e-14)


def test_user_diffeqsolve_refuses_what_it_cannot_sweep():
    """What the sweep does not support raises `ValueError` when the solve is traced (here
    only traced, never run), naming the fix."""
    y0, k = jnp.array([1.0, 0.0]), jnp.array([4.0, 0.3])

    def trace(term=diffrax.ODETerm(_forced_pendulum), solver=diffrax.Tsit5(), **options):  # noqa: B008
        options = dict(dict(max_steps=64, adjoint=jaxdae.ReverseSweepAdjoint()), **options)
        return eqx.filter_eval_shape(
            lambda y0: diffrax.diffeqsolve(term, solver, 0.0, 1.0, 0.1, y0, args=k, **options), y0
        )

    trace()  # supported
    fix = "RecursiveCheckpointAdjoint"
    with pytest.raises(ValueError, match=f"explicit Runge–Kutta.*Kvaerno5.*{fix}"):
        trace(solver=diffrax.Kvaerno5(), stepsize_controller=_PID)
    with pytest.raises(ValueError, match="integer `max_steps`"):
        trace(max_steps=None)
    with pytest.raises(ValueError, match=f"dense=True.*SaveAt\\(ts=...\\).*{fix}"):
        trace(saveat=diffrax.SaveAt(dense=True))
    with pytest.raises(ValueError, match=f"steps=True.*SaveAt\\(ts=...\\).*{fix}"):
        trace(saveat=diffrax.SaveAt(steps=True))
    with pytest.raises(ValueError, match=f"apply `fn`.*{fix}"):
        trace(saveat=diffrax.SaveAt(t1=True, fn=lambda t, y, args: y[0]))
    with pytest.raises(ValueError, match=f"controller_state.*{fix}"):
        trace(saveat=diffrax.SaveAt(t1=True, controller_state=True))
    with pytest.raises(ValueError, match=f"without a `root_finder`.*{fix}"):
        trace(
            event=diffrax.Event(
                lambda t, y, args, **kwargs: y[0] + 2.0,
                root_finder=optx.Newton(rtol=1e-8, atol=1e-8),
            )
        )
    term = diffrax.ODETerm(_forced_pendulum)
    with pytest.raises(ValueError, match=f"do not pass `solver_state`.*{fix}"):
        trace(solver_state=diffrax.Tsit5().init(term, 0.0, 0.1, y0, k))
    with pytest.raises(ValueError, match=f"one `diffrax.ODETerm`.*{fix}"):
        trace(term=diffrax.MultiTerm(term, term))
