"""The tree mechanism in joint coordinates: its recursive dynamics against Lagrange's
equations derived by automatic differentiation, against the same bodies and joints in
absolute coordinates, loops closed by constraints, gradients against central differences,
URDF import and the errors of what it cannot build."""

import contextlib
from pathlib import Path

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
import jaxdae.multibody as mb
from jaxdae import _thresholds
from jaxdae._integration._validation import factored_positive_definite
from jaxdae.examples._bricard import bricard
from jaxdae.multibody._articulated import ArticulatedFactor, tree_levels
from jaxdae.multibody._spatial import apply_inertia

ARM = Path(__file__).parent / "data" / "three_link_arm.urdf"
INERTIA = np.diag([0.02, 0.03, 0.04])


def mixed_parts(damping=0.5):
    """A free base carrying a ball-jointed link, a hinged arm on it and a welded weight,
    with a spring-damper across: every kind of tree joint."""
    bodies = [
        mb.RigidBody(
            "base",
            2.0,
            INERTIA,
            {"s": (0.1, 0.0, 0.05), "w": (0.0, 0.1, 0.0)},
            position=(0.0, 0.0, 1.0),
        ),
        mb.RigidBody(
            "ball",
            1.0,
            0.5 * INERTIA,
            {"top": (0.0, 0.0, 0.2), "h": (0.05, 0.0, -0.1)},
            orientations={"top": mb.rotation_matrix((1.0, 1.0, 0.0), 0.3)},
        ),
        mb.RigidBody("arm", 0.5, 0.3 * INERTIA, {"p": (0.0, 0.0, 0.15)}),
        mb.RigidBody("slide", 0.4, 0.2 * INERTIA, {"c": (0.0, 0.0, 0.0)}),
        mb.RigidBody("weld", 0.3, 0.2 * INERTIA, {"f": (0.02, 0.01, 0.0)}),
    ]
    joints = [
        mb.Spherical("base.s", "ball.top"),
        mb.Revolute("ball.h", "arm.p", axis=(0, 1, 1)),
        mb.Prismatic("arm", "slide.c", axis=(1.0, 0.0, 1.0)),
        mb.Fixed("base.w", "weld.f"),
    ]
    forces = [mb.Gravity(), mb.SpringDamper("ball.h", "weld", 10.0, damping, 0.2)]
    return bodies, joints, forces


@pytest.fixture(scope="module")
def mixed():
    return mb.TreeMechanism(*mixed_parts())


@contextlib.contextmanager
def _recursive_path():
    """Every tree traced inside takes the recursive path (the threshold's choice after)."""
    default = _thresholds.ARTICULATED_MIN_BODIES
    _thresholds.ARTICULATED_MIN_BODIES = 1
    tree_levels.cache_clear()
    try:
        yield
    finally:
        _thresholds.ARTICULATED_MIN_BODIES = default
        tree_levels.cache_clear()


@pytest.fixture
def articulated():
    """The recursive path for the whole test; the functions compiled before and during it
    are dropped (their traces hold the other choice)."""
    jax.clear_caches()
    with _recursive_path():
        yield
    jax.clear_caches()


def _long_chain():
    """A chain of 12 links (hinges about alternating axes): the recursive path."""
    links = [
        mb.RigidBody(f"l{i}", 0.1, 1e-4 * np.eye(3), {"end": (0.0, 0.0, -0.1)}) for i in range(12)
    ]
    hinges = [
        mb.Revolute("ground" if i == 0 else f"l{i - 1}.end", f"l{i}", axis=(0, 1, i % 2))
        for i in range(12)
    ]
    return mb.TreeMechanism(links, hinges, [mb.Gravity()])


def test_a_long_chain_takes_the_articulated_solve():
    """A chain of 12 links (hinges about alternating axes) takes the recursive path; its
    factor's solve with the forces and the identity equals `M⁻¹` of the dense `M`."""
    chain = _long_chain()
    assert tree_levels(chain.topology) is not None
    terms = _terms(chain, jnp.linspace(0.0, 1.0, 12), jnp.ones(12))
    factor = terms.mass_operator.factor
    assert isinstance(factor, ArticulatedFactor)
    np.testing.assert_allclose(terms.momenta, terms.mass_matrix @ jnp.ones(12), atol=1e-13)
    rhs = jnp.concatenate([terms.forces[:, None], jnp.eye(12)], axis=1)
    solution = eqx.filter_jit(lambda f, b: f.solve(b))(factor, rhs)
    np.testing.assert_allclose(
        solution,
        np.linalg.solve(terms.mass_matrix, rhs),
        rtol=0,
        atol=1e-12 * float(jnp.max(jnp.abs(solution))),
    )


def test_time_stepping_takes_the_dense_path_of_a_deep_tree():
    """A time step factors the dense `M` itself, so a tree that would take the recursive
    path is solved on its dense one: the same terms, without the articulated factor. A
    tree already on the dense path is itself."""
    chain = _long_chain()
    dense = chain._dense_mass_variant()
    assert tree_levels(chain.topology) is not None and dense._levels() is None
    small = mb.TreeMechanism(*mixed_parts())
    assert small._levels() is None and small._dense_mass_variant() is small
    q, v = jnp.linspace(0.0, 1.0, 12), jnp.ones(12)
    recursive, direct = _terms(chain, q, v), _terms(dense, q, v)
    assert isinstance(recursive.mass_operator.factor, ArticulatedFactor)
    assert not isinstance(direct.mass_operator.factor, ArticulatedFactor)
    np.testing.assert_allclose(direct.mass_matrix, recursive.mass_matrix, rtol=0, atol=1e-14)
    np.testing.assert_allclose(direct.forces, recursive.forces, rtol=1e-12, atol=1e-13)


def test_articulated_pivots_say_whether_the_mass_is_positive_definite():
    """The articulated factor's pivots say whether `M` is positive definite, as the dense
    `M`'s eigenvalues do, also where one link's mass is negative (an optimizer's step can
    make it so); they are `M`'s block pivots, so their determinants multiply to `det M`.
    `simulate`'s check of the initial state reads them, and the tree's forces are nan where
    they show `M` not positive definite."""
    chain, q = _long_chain(), jnp.linspace(0.0, 1.0, 12)
    for mass in (0.1, -0.3):
        model = eqx.tree_at(lambda m: m.bodies[5].mass, chain, jnp.asarray(mass))
        terms = _terms(model, q, jnp.ones(12))
        lowest = np.linalg.eigvalsh(np.asarray(terms.mass_matrix))[0]
        factor = terms.mass_operator.factor
        assert isinstance(factor, ArticulatedFactor)
        assert bool(factor.positive_definite()) == (lowest > 0)
        assert bool(factored_positive_definite(terms)) == (lowest > 0)
        # Where it is not, the forces are nan, so that a solve stalls there.
        assert bool(jnp.all(jnp.isfinite(terms.forces))) == (lowest > 0)
        pivots = 1 / np.asarray(factor.pivots).reshape(-1)
        np.testing.assert_allclose(np.prod(pivots), np.linalg.det(terms.mass_matrix), rtol=1e-9)


@pytest.mark.slow
def test_a_traced_solve_of_an_indefinite_tree_stalls_at_the_start():
    """A traced solve of a tree on the recursive path whose mass matrix is not positive
    definite stalls at `t0`: its forces are nan there (the articulated pivots show it), and
    the error names the likely causes; eagerly, the initial state's message."""
    chain = _long_chain()
    bad = eqx.tree_at(lambda m: m.bodies[5].mass, chain, jnp.asarray(-0.3))
    solve = eqx.filter_jit(
        lambda model: (
            jaxdae.simulate(
                model, jaxdae.Unstabilized(), 0.0, 0.01, jnp.zeros(12), jnp.zeros(12)
            ).q_final
        )
    )
    assert np.all(np.isfinite(solve(chain)))
    with pytest.raises(Exception, match=r"minimum step size(.|\n)*not positive definite"):
        jax.block_until_ready(solve(bad))
    with pytest.raises(ValueError, match="mass matrix at `q0` is not symmetric positive"):
        jaxdae.simulate(bad, jaxdae.Unstabilized(), 0.0, 0.01, jnp.zeros(12), jnp.zeros(12))


def _hinged_pair():
    """Two links hinged about parallel axes, the second of negative mass (`m₂ = −0.2`,
    centre 0.3 from its hinge, 0.5 between the hinges, inertias 0.095 and 0.028 about the
    axes): `det M = 4.5·10⁻⁴ − 9·10⁻⁴ cos² q₁`, positive definite where
    `|cos q₁| < 1/√2`, indefinite elsewhere."""
    bodies = [
        mb.RigidBody("a", 1.0, 0.095 * np.eye(3), {"end": (0.0, 0.0, -0.5)}),
        mb.RigidBody("b", 1.0, 0.028 * np.eye(3), {"top": (0.0, 0.0, 0.3)}),
    ]
    joints = [
        mb.Revolute("ground", "a", axis=(0, 1, 0)),
        mb.Revolute("a.end", "b.top", axis=(0, 1, 0)),
    ]
    tree = mb.TreeMechanism(bodies, joints, [mb.Gravity()])
    return eqx.tree_at(lambda m: m.bodies[1].mass, tree, jnp.asarray(-0.2))


def test_dense_cholesky_pivots_say_whether_the_mass_is_positive_definite():
    """On the dense path (a tree of fewer bodies than the recursive path takes) the
    Cholesky factor's pivots say whether `M` is positive definite, and where they do not
    the accelerations through the factor are nan, as on the recursive path: so a traced
    solve need not evaluate `M` and the forces at `q0` to check them."""
    pair = _hinged_pair()
    terms_of = eqx.filter_jit(mb.TreeMechanism.terms)
    for angle in (0.0, 0.3, 1.2, np.pi / 2):
        terms = terms_of(pair, 0.0, jnp.array([0.0, angle]), jnp.zeros(2))
        assert not isinstance(terms.mass_operator.factor, ArticulatedFactor)
        definite = abs(np.cos(angle)) < 2**-0.5  # `det M > 0` (`_hinged_pair`)
        assert bool(factored_positive_definite(terms)) == definite
        # Where it is not, the solves through the factor and `M` itself are nan.
        accelerations = terms.mass_operator.factor.solve(terms.forces[:, None])
        assert bool(jnp.all(jnp.isfinite(accelerations))) == definite
        assert bool(jnp.all(jnp.isfinite(terms.mass_matrix))) == definite


@pytest.mark.perf(reason="pins what a traced solve of a tree evaluates at q0 (compile time)")
def test_a_traced_solve_of_a_tree_evaluates_diagnostics_only_where_read():
    """A traced solve of a tree (here on the dense path) whose caller reads only the final
    state holds no diagnostics in its compiled program: the initial state's checks do not
    read `M` and the forces at `q0` (the factor's pivots stall the solve instead), and XLA
    removes the rest. Read, the energy brings them back."""
    pair = eqx.tree_at(lambda m: m.bodies[1].mass, _hinged_pair(), jnp.asarray(0.2))

    def program(read):
        def run(q0):
            return read(jaxdae.simulate(pair, jaxdae.Unstabilized(), 0.0, 0.1, q0, jnp.ones(2)))

        return jax.jit(run).lower(jnp.array([0.0, 0.5])).compile().as_text()

    assert "jit(state_diagnostics)" not in program(lambda sol: sol.q_final)
    assert "jit(state_diagnostics)" in program(lambda sol: sol.energy)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["dense", "articulated"])
def test_a_tree_whose_mass_turns_indefinite_stalls(path, request):
    """Where the factor's pivots show `M` not positive definite, the accelerations
    through it are nan (on the recursive path its forces are, since a negative `1 × 1`
    pivot inverts to a finite number): a solve stalls there instead of going on. Traced
    from such a start, `dt_min_reached` at `t0`; eagerly, from a start where `M` is
    positive definite and into a configuration where it is not, `indefinite_mass_matrix`
    where it turned."""
    if path == "articulated":
        request.getfixturevalue("articulated")
    pair = _hinged_pair()
    for angle, definite in ((0.0, False), (np.pi / 2, True)):
        terms = eqx.filter_jit(mb.TreeMechanism.terms)(
            pair, 0.0, jnp.array([0.0, angle]), jnp.zeros(2)
        )
        assert isinstance(terms.mass_operator.factor, ArticulatedFactor) == (path == "articulated")
        factor = terms.mass_operator.factor
        assert bool(factor.positive_definite()) == definite
        accelerations = factor.solve(terms.forces[:, None])
        assert bool(jnp.all(jnp.isfinite(accelerations))) == definite
    # Also generalized-α, whose Newton matrix holds `M` itself rather than the factor.
    for solver in (diffrax.Tsit5(), jaxdae.GeneralizedAlpha()):
        solve = eqx.filter_jit(
            lambda q0, solver=solver: jaxdae.simulate(
                pair,
                jaxdae.Unstabilized(),
                0.0,
                0.4,
                q0,
                jnp.array([0.0, 4.0]),
                solver=solver,
                throw=False,
            )
        )
        traced = solve(jnp.zeros(2))
        assert traced.result == jaxdae.RESULTS.dt_min_reached and float(traced.t_final) == 0.0
    eager = jaxdae.simulate(
        pair,
        jaxdae.Unstabilized(),
        0.0,
        0.4,
        jnp.array([0.0, np.pi / 2]),
        jnp.array([0.0, 4.0]),
        throw=False,
    )
    assert eager.result == jaxdae.RESULTS.indefinite_mass_matrix
    assert abs(np.cos(float(eager.q_final[1]))) == pytest.approx(2**-0.5, abs=1e-3)


@pytest.mark.slow
def test_articulated_solve_is_the_inverse_mass():
    """The articulated-body factor of a tree with every kind of joint and a loop closed by
    a ball joint: its solve with the forces and `Jᵀ` equals `M⁻¹` of the dense `M`, and
    its forces (Newton–Euler's sums in the same pass) those of the dense path."""
    bodies, joints, forces = mixed_parts()
    tree = mb.TreeMechanism(bodies, joints + [mb.Spherical("slide.c", "weld.f")], forces)
    assert tree.closure_joints == ("spherical_1",) and tree_levels(tree.topology) is None
    rng = np.random.default_rng(3)
    q = tree.reference_coordinates() + 0.3 * jnp.asarray(rng.normal(size=13))
    v = jnp.asarray(rng.normal(size=13))

    factors = []

    @jax.jit
    def both(q, v):  # one compiled function: the dense path's forces, the recursive terms
        dense = tree.terms(0.0, q, v)
        with _recursive_path():
            terms = tree.terms(0.0, q, v)
        factors.append(terms.mass_operator.factor)
        rhs = jnp.concatenate([terms.forces[:, None], terms.jacobian.T], axis=1)
        return dense.forces, terms.forces, terms.mass_matrix, factors[0].solve(rhs), rhs

    dense_forces, forces, mass, solution, rhs = both(q, v)
    assert isinstance(factors[0], ArticulatedFactor) and rhs.shape == (13, 4)
    np.testing.assert_allclose(
        solution, np.linalg.solve(mass, rhs), rtol=0, atol=1e-12 * float(jnp.max(jnp.abs(solution)))
    )
    np.testing.assert_allclose(forces, dense_forces, rtol=0, atol=1e-12)


@eqx.filter_jit
@eqx.filter_jit
def _lagrange(tree, q, v):
    """`(M, Q)` of Lagrange's equations of the tree's energy, by automatic differentiation."""

    def kinetic(q_, v_):
        rotations, centres, _, velocities, _ = tree._motion(q_, v_)
        parts = tree._inertias(rotations, centres)
        return (
            0.5 * jnp.sum(velocities * apply_inertia(parts, velocities))
            + tree._norm_terms(q_, v_)[1]
        )

    def lagrangian(q_, v_):
        return kinetic(q_, v_) - tree.potential_energy(0.0, q_)

    mass = jax.hessian(kinetic, argnums=1)(q, v)
    forces = jax.grad(lagrangian)(q, v) - jax.jacfwd(jax.grad(lagrangian, argnums=1))(q, v) @ v
    return mass, forces


def test_recursive_dynamics_are_lagranges_equations(mixed):
    """CRBA's `M` and RNEA's forces equal Lagrange's equations of the kinetic and potential
    energy, with a free base, a ball joint (unnormalized Euler parameters), a hinge, a
    slider and a weld; the damper's power is `−c ℓ̇²`; inverse dynamics inverts them."""
    assert mixed.coordinate_names == (
        "base.x",
        "base.y",
        "base.z",
        "base.e0",
        "base.e1",
        "base.e2",
        "base.e3",
        "spherical_0.e0",
        "spherical_0.e1",
        "spherical_0.e2",
        "spherical_0.e3",
        "revolute_0",
        "prismatic_0",
    )
    rng = np.random.default_rng(1)
    q = mixed.reference_coordinates() + 0.3 * jnp.asarray(rng.normal(size=13))
    v = jnp.asarray(rng.normal(size=13))
    terms = _terms(mixed, q, v)
    undamped = mb.TreeMechanism(*mixed_parts(damping=0.0))
    undamped_terms = _terms(undamped, q, v)
    mass, forces = _lagrange(undamped, q, v)
    np.testing.assert_allclose(terms.mass_matrix, mass, atol=1e-13)
    np.testing.assert_allclose(undamped_terms.forces, forces, atol=1e-12)
    # The momenta the terms carry are the system's: a solve's diagnostics read them there.
    np.testing.assert_allclose(terms.momenta, mass @ v, atol=1e-12)
    assert float(jnp.linalg.eigvalsh(terms.mass_matrix)[0]) > 0
    rate = eqx.filter_jit(
        lambda m: jax.jvp(
            lambda q_: jnp.linalg.norm(
                m.marker_position(q_, "weld") - m.marker_position(q_, "ball.h")
            ),
            (q,),
            (v,),
        )[1]
    )(mixed)
    damper_power = (terms.forces - undamped_terms.forces) @ v
    assert float(damper_power) == pytest.approx(-0.5 * float(rate) ** 2, rel=1e-10)
    acceleration = jnp.linalg.solve(terms.mass_matrix, terms.forces)
    inverse = eqx.filter_jit(lambda m, a: m.inverse_dynamics(0.0, q, v, a))(mixed, acceleration)
    np.testing.assert_allclose(inverse, 0.0, atol=1e-12)


@eqx.filter_jit
def _terms(model, q, v):
    return model.terms(0.0, q, v)


@eqx.filter_jit
def _marker_acceleration(model, q, v, acceleration, marker):
    def position(q_):
        return model.marker_position(q_, marker)

    velocity = lambda q_: jax.jvp(position, (q_,), (v,))[1]  # noqa: E731
    return jax.jvp(velocity, (q,), (v,))[1] + jax.jvp(position, (q,), (acceleration,))[1]


@eqx.filter_jit
def _accelerations(model, q, v):
    """`q̈` at a consistent state (the gains do not act there)."""
    return jaxdae.PseudoInverse(1.0, 1.0).accelerations(model.terms(0.0, q, v))[0]


@pytest.mark.slow
def test_agrees_with_absolute_coordinates():
    """The URDF arm in joint coordinates (the default of `mechanism()`) and in absolute
    coordinates: the same pose and the same accelerations of every marker."""
    robot = mb.load_urdf(ARM)
    forces = [mb.Gravity(), mb.SpringDamper("forearm.frame", "slider.frame", 200.0, 3.0, 0.45)]
    tree = robot.mechanism(forces=forces, limits=False)
    absolute = robot.mechanism(forces=forces, limits=False, coordinates="absolute")
    assert isinstance(tree, mb.TreeMechanism) and tree.coordinate_names == robot.joint_names
    assert tree.num_equations == 0 and tree.gap_names == ()
    state = {"yaw": (0.3, 2.0), "shoulder": (0.4, 1.0), "elbow": (-0.8, -0.5), "wrist": (0.05, 0.1)}
    q_tree, v_tree = tree.initial_state(joint_coordinates=state)
    q_abs, v_abs = absolute.initial_state(joint_coordinates=state, tol=1e-12)
    a_tree = _accelerations(tree, q_tree, v_tree)
    a_abs = _accelerations(absolute, q_abs, v_abs)
    for marker in ("turret.frame", "upper_arm", "forearm.wrist", "slider.tool"):
        np.testing.assert_allclose(
            tree.marker_position(q_tree, marker),
            absolute.marker_position(q_abs, marker),
            atol=1e-10,
        )
        np.testing.assert_allclose(
            tree.marker_velocity(q_tree, v_tree, marker),
            absolute.marker_velocity(q_abs, v_abs, marker),
            atol=1e-10,
        )
        np.testing.assert_allclose(
            _marker_acceleration(tree, q_tree, v_tree, a_tree, marker),
            _marker_acceleration(absolute, q_abs, v_abs, a_abs, marker),
            atol=1e-8,
        )


@pytest.mark.slow
def test_loops_are_closed_by_the_extra_joints():
    """Bricard's mechanism: five joints carry the five bars, the sixth closes the loop with
    its five equations, one redundant; the accelerations match the absolute model's."""
    absolute = bricard()
    tree = mb.TreeMechanism((absolute.ground,) + absolute.bodies, absolute.joints, absolute.forces)
    assert tree.coordinate_names == ("j0", "j1", "j2", "j3", "j4")
    assert tree.closure_joints == ("j5",)
    q_tree, v_tree = tree.initial_state()
    assert tree.mobility(q_tree) == mb.Mobility(5, 5, 0, 4, 1, 1)
    assert float(jnp.max(jnp.abs(tree.constraints(0.0, q_tree)))) < 1e-14
    q_abs, v_abs = absolute.initial_state()
    np.testing.assert_allclose(
        _marker_acceleration(tree, q_tree, v_tree, _accelerations(tree, q_tree, v_tree), "bar3.b"),
        _marker_acceleration(
            absolute, q_abs, v_abs, _accelerations(absolute, q_abs, v_abs), "bar3.b"
        ),
        atol=1e-9,
    )


@pytest.mark.slow
def test_flyball_governor_in_joint_coordinates():
    """The IFToMM flyball governor is a tree (spin, slide and two hinges, the springs are
    force elements): four coordinates, no constraints, the same accelerations of its
    markers as the absolute model from the benchmark's start."""
    from jaxdae.examples._flyball_governor import governor, initial_state

    absolute = governor()
    tree = mb.TreeMechanism((absolute.ground,) + absolute.bodies, absolute.joints, absolute.forces)
    assert tree.coordinate_names == ("spin", "slide", "hinge1", "hinge2")
    assert tree.num_equations == 0
    q_abs, v_abs = initial_state(absolute)
    coordinates, rates = absolute.joint_coordinates(q_abs), absolute.joint_rates(q_abs, v_abs)
    q_tree, v_tree = tree.initial_state(
        joint_coordinates={name: (coordinates[name], rates[name]) for name in tree.coordinate_names}
    )
    for marker in ("rod1.middle", "rod2.hinge", "slider.s1"):
        np.testing.assert_allclose(
            _marker_acceleration(
                tree, q_tree, v_tree, _accelerations(tree, q_tree, v_tree), marker
            ),
            _marker_acceleration(
                absolute, q_abs, v_abs, _accelerations(absolute, q_abs, v_abs), marker
            ),
            atol=1e-8,
        )


@pytest.mark.slow
@pytest.mark.parametrize("path", ["dense", "articulated"])
def test_design_gradients_match_central_differences(mixed, path, request):
    """The accelerations' derivatives with respect to a mass, an inertia, a joint's origin
    and its axis, by reverse mode and by central differences, with `M` factored densely
    and by the articulated-body algorithm."""
    if path == "articulated":
        request.getfixturevalue("articulated")
    rng = np.random.default_rng(2)
    q = mixed.reference_coordinates() + 0.2 * jnp.asarray(rng.normal(size=13))
    v = jnp.asarray(rng.normal(size=13))
    weights = jnp.asarray(rng.normal(size=13))

    def loss(model):
        return weights @ _accelerations(model, q, v)

    loss = eqx.filter_jit(loss)
    grads = eqx.filter_jit(eqx.filter_grad(loss))(mixed)
    picks = {
        "mass": (lambda m: m.bodies[2].mass, 1e-6),
        "inertia": (lambda m: m.bodies[1].inertia, 1e-6),
        "origin": (lambda m: m.bodies[1].markers["h"], 1e-6),
        "axis": (lambda m: m.joints[1].axis, 1e-6),
    }
    for name, (where, step) in picks.items():
        value = where(mixed)
        direction = jnp.asarray(rng.normal(size=value.shape))
        if name == "inertia":
            direction = 0.5 * (direction + direction.T) * 0.01
        plus = eqx.tree_at(where, mixed, value + step * direction)
        minus = eqx.tree_at(where, mixed, value - step * direction)
        central = (loss(plus) - loss(minus)) / (2 * step)
        exact = jnp.sum(where(grads) * direction)
        assert float(exact) == pytest.approx(float(central), rel=1e-6, abs=1e-8), name


@pytest.mark.slow
def test_simulates_and_keeps_the_energy(mixed):
    """A short free flight of the mixed tree with the damper off: the energy stays, and the
    norms of the Euler parameters keep their values."""
    model = mb.TreeMechanism(*mixed_parts(damping=0.0))
    q0 = model.reference_coordinates()
    v0 = (
        jnp.zeros(13)
        .at[jnp.asarray([0, 5, 8, 11, 12])]
        .set(jnp.asarray([0.5, 1.0, -2.0, 3.0, 0.2]))
    )
    v0 = v0.at[3:7].set(v0[3:7] - q0[3:7] * (q0[3:7] @ v0[3:7]))  # no change of norm
    sol = jaxdae.simulate(
        model,
        jaxdae.Unstabilized(),
        0.0,
        0.3,
        q0,
        v0,
        ts=jnp.linspace(0.0, 0.3, 4),
        rtol=1e-10,
        atol=1e-10,
    )
    energy = jax.vmap(model.energy)(sol.ts, sol.q, sol.v)
    assert float(jnp.max(jnp.abs(energy - energy[0]))) < 1e-8
    np.testing.assert_allclose(jnp.linalg.norm(sol.q[:, 3:7], axis=1), 1.0, atol=1e-9)


def test_refuses_what_it_cannot_build(unchecked):
    planar = mb.PlanarBody("p", 1.0, 0.1)
    with pytest.raises(ValueError, match="TreeMechanism is spatial"):
        mb.TreeMechanism([planar], [mb.Revolute("ground", "p")])
    link = mb.RigidBody("link", 1.0, INERTIA, {"a": (0.0, 0.0, 0.1)})
    other = mb.RigidBody("other", 1.0, INERTIA, {"a": (0.0, 0.0, 0.1)})
    with pytest.raises(ValueError, match="marker `a` is on the body nearer the ground"):
        mb.TreeMechanism(
            [link, other], [mb.Revolute("ground", "link"), mb.Revolute("other.a", "link.a")]
        )
    with pytest.raises(ValueError, match="not in the mechanism"):
        mb.TreeMechanism(
            [link], [mb.Revolute("ground", "link.a")], [mb.JointSpringDamper("elbow", 1.0)]
        )
    robot = mb.load_urdf(ARM)
    assert isinstance(robot.mechanism(), mb.TreeMechanism)
    assert isinstance(robot.mechanism(coordinates="absolute"), mb.Mechanism)
    with pytest.raises(ValueError, match="'joint' or 'absolute'"):
        robot.mechanism(coordinates="relative")


@pytest.mark.slow
def test_solve_gradients_match_central_differences():
    """The derivatives of a solve of the URDF arm with respect to a mass, an inertia, a
    joint's origin and its axis: reverse mode through `simulate` against central
    differences."""
    tree = mb.load_urdf(ARM).mechanism(forces=[mb.Gravity()], limits=False)
    q0, v0 = jnp.array([0.1, 0.4, -0.8, 0.05]), jnp.array([1.0, 0.0, 0.5, 0.0])

    @eqx.filter_jit
    def loss(model):
        sol = jaxdae.simulate(
            model, jaxdae.Unstabilized(), 0.0, 0.5, q0, v0, rtol=1e-10, atol=1e-10
        )
        return jnp.sum(sol.q_final**2)

    grads = eqx.filter_jit(eqx.filter_grad(loss))(tree)
    rng = np.random.default_rng(0)
    picks = {
        "mass": lambda m: m.bodies[2].mass,
        "origin": lambda m: m.bodies[1].markers["elbow"],
        "axis": lambda m: m.joints[2].axis,
        "inertia": lambda m: m.bodies[3].inertia,
    }
    for name, where in picks.items():
        value = where(tree)
        direction = jnp.asarray(rng.normal(size=value.shape))
        if name == "inertia":
            direction = 0.005 * (direction + direction.T)
        step = 1e-6
        central = (
            loss(eqx.tree_at(where, tree, value + step * direction))
            - loss(eqx.tree_at(where, tree, value - step * direction))
        ) / (2 * step)
        assert float(jnp.sum(where(grads) * direction)) == pytest.approx(
            float(central), rel=1e-6
        ), name
