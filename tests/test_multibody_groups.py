"""Elements of one kind evaluated together (`jaxdae/multibody/_groups.py`): a mechanism of
many joints, bodies and force elements against the same model written by hand, the row order
of its constraints, gradients through grouped parameters, the structure it hands the core,
and the size of its traced program against the number of links."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
import jaxdae.multibody as mb
from jaxdae._compilation._banded import banded_plan
from jaxdae._compilation._sparse import Pattern
from jaxdae._systems._structure import terms_structure
from jaxdae.multibody._kinematics import Kinematics

from ._jaxprs import equations

G = 9.81
HALF = 0.2  # half the length of a link
BAUMGARTE = jaxdae.Baumgarte(20.0, 100.0)
PRISMATIC_AXIS = (1.0, 0.3)
PRISMATIC_ANGLE = 0.2
DISTANCE = 0.05


def _kind(i):
    """The joint between links `i − 1` and `i` (the first joint, ground to link 0, is a
    revolute): kinds interleaved so that grouping them must put their rows back in order."""
    return ("revolute", "prismatic", "distance")[i % 3]


def _rotation(theta):
    c, s = jnp.cos(theta), jnp.sin(theta)
    return jnp.stack([jnp.stack([c, -s]), jnp.stack([s, c])])


def mixed_chain(n=7):
    """`n` links of different masses: revolute, prismatic and distance joints interleaved,
    a spring-damper across every second pair of links, a torque on every link, gravity."""
    ends = {"a": (-HALF, 0.0), "b": (HALF, 0.0)}
    bodies = [
        mb.PlanarBody(
            f"l{i}", 1.0 + 0.1 * i, 0.01 * (1 + i), markers=ends, position=((2 * i + 1) * HALF, 0.0)
        )
        for i in range(n)
    ]
    joints = [mb.Revolute("ground", "l0.a", name="base")]
    for i in range(1, n):
        a, b, kind = f"l{i - 1}.b", f"l{i}.a", _kind(i)
        if kind == "revolute":
            joints.append(mb.Revolute(a, b))
        elif kind == "prismatic":
            joints.append(mb.Prismatic(a, b, PRISMATIC_AXIS, angle=PRISMATIC_ANGLE))
        else:
            joints.append(mb.Distance(a, b, DISTANCE))
    forces = [mb.Gravity()]
    forces += [
        mb.SpringDamper(f"l{i - 2}.a", f"l{i}.b", 5.0 + i, 0.1 * i, 0.8) for i in range(2, n, 2)
    ]
    forces += [mb.Torque(f"l{i}", 0.05 * (i + 1)) for i in range(n)]
    return mb.Mechanism(bodies, joints, forces)


class HandMixedChain(jaxdae.LagrangianSystem):
    """`mixed_chain` written by hand in the same coordinates, joint by joint."""

    masses: jax.Array
    inertias: jax.Array

    def __init__(self, n=7):
        self.masses = 1.0 + 0.1 * jnp.arange(n)
        self.inertias = 0.01 * (1 + jnp.arange(n))

    def _ends(self, q):
        b = q.reshape(-1, 3)
        arm = jnp.array([HALF, 0.0])
        rot = jax.vmap(_rotation)(b[:, 2])
        return b, b[:, :2] - rot @ arm, b[:, :2] + rot @ arm, rot

    def mass_matrix(self, t, q):
        return jnp.diag(jnp.stack([self.masses, self.masses, self.inertias], 1).reshape(-1))

    def _springs(self, q):
        _, a_ends, b_ends, _ = self._ends(q)
        n = self.masses.shape[0]
        return [(5.0 + i, 0.1 * i, a_ends[i - 2], b_ends[i]) for i in range(2, n, 2)]

    def potential_energy(self, t, q):
        energy = G * jnp.sum(self.masses * q.reshape(-1, 3)[:, 1])
        for k, _, a, b in self._springs(q):
            energy = energy + 0.5 * k * (jnp.linalg.norm(b - a) - 0.8) ** 2
        return energy

    def generalized_forces(self, t, q, v):
        def rayleigh(v_):
            rates = jax.jvp(
                lambda q_: jnp.stack([jnp.linalg.norm(b - a) for _, _, a, b in self._springs(q_)]),
                (q,),
                (v_,),
            )[1]
            dampings = jnp.array([c for _, c, _, _ in self._springs(q)])
            return 0.5 * jnp.sum(dampings * rates**2)

        torques = (
            jnp.zeros((self.masses.shape[0], 3))
            .at[:, 2]
            .set(0.05 * (1 + jnp.arange(self.masses.shape[0])))
        )
        return torques.reshape(-1) - jax.grad(rayleigh)(v)

    def constraints(self, t, q):
        b, a_ends, b_ends, rot = self._ends(q)
        rows = [a_ends[0]]
        for i in range(1, b.shape[0]):
            pa, pb = b_ends[i - 1], a_ends[i]
            kind = _kind(i)
            if kind == "revolute":
                rows.append(pb - pa)
            elif kind == "prismatic":
                u = rot[i - 1] @ jnp.asarray(PRISMATIC_AXIS)
                u = u / jnp.linalg.norm(u)
                normal = jnp.stack([-u[1], u[0]])
                rows.append(
                    jnp.stack([normal @ (pb - pa), b[i, 2] - b[i - 1, 2] - PRISMATIC_ANGLE])
                )
            else:
                d = pb - pa
                rows.append(((d @ d - DISTANCE**2) / (2 * DISTANCE))[None])
        return jnp.concatenate(rows)


def _state(n, seed=0):
    rng = np.random.default_rng(seed)
    q = mixed_chain(n).reference_coordinates() + 0.2 * rng.standard_normal(3 * n)
    return jnp.asarray(q), jnp.asarray(rng.standard_normal(3 * n))


def _accelerations(system, q, v):
    return jaxdae.Unstabilized().accelerations(system.terms(jnp.asarray(0.3), q, v))


@pytest.mark.slow
def test_mixed_chain_matches_hand_written_rows_in_order():
    """Joints of three kinds interleaved (each kind evaluated as one group), grouped
    spring-dampers and torques: every term, `q̈` and the multipliers equal the
    hand-written model's, row by row."""
    n = 7
    built, hand = mixed_chain(n), HandMixedChain(n)
    q, v = _state(n)
    t = jnp.asarray(0.3)
    methods = (
        ("constraints", (t, q)),
        ("mass_matrix", (t, q)),
        ("potential_energy", (t, q)),
        ("generalized_forces", (t, q, v)),
        ("kinetic_energy", (t, q, v)),
    )

    @eqx.filter_jit  # compiled once per model: evaluated eagerly, the terms take seconds
    def evaluate(system):
        return (
            [getattr(system, method)(*args) for method, args in methods],
            _accelerations(system, q, v),
        )

    (values_b, (qdd_b, lam_b)), (values_h, (qdd_h, lam_h)) = evaluate(built), evaluate(hand)
    for (method, _), value_b, value_h in zip(methods, values_b, values_h, strict=True):
        np.testing.assert_allclose(value_b, value_h, rtol=1e-12, atol=1e-12, err_msg=method)
    np.testing.assert_allclose(qdd_b, qdd_h, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(lam_b, lam_h, rtol=1e-10, atol=1e-10)
    # `joint_rows` names the same rows the hand-written model stacks joint by joint
    phi_b, phi_h = values_b[0], values_h[0]
    start = 0
    for name, size in zip(built.joint_names, built.joint_sizes, strict=True):
        assert built.joint_rows(name) == slice(start, start + size)
        np.testing.assert_allclose(
            phi_b[built.joint_rows(name)], phi_h[start : start + size], atol=1e-14
        )
        start += size


@pytest.mark.slow
def test_gradients_through_grouped_parameters():
    """Derivatives with respect to a body's mass, a marker (where a joint sits) and a
    joint's parameter, each one element of a group, against central differences."""
    n = 7
    mech = mixed_chain(n)
    q, v = _state(n, seed=1)

    @eqx.filter_jit
    def loss(m):  # Baumgarte's terms read Φ itself (a joint's angle shifts only Φ)
        qdd, lam = BAUMGARTE.accelerations(m.terms(jnp.asarray(0.3), q, v))
        return jnp.sum(qdd**2) + jnp.sum(jnp.sin(lam))

    grads = eqx.filter_grad(loss)(mech)
    for where, h in (
        (lambda m: m.bodies[3].mass, 1e-5),
        (lambda m: m.bodies[4].markers["a"], jnp.array([1e-6, 2e-6])),
        (lambda m: m.joints[5].length, 1e-6),
        (lambda m: m.joints[4].angle, 1e-6),
    ):
        value = where(mech)
        h = jnp.asarray(h)
        diff = (
            loss(eqx.tree_at(where, mech, value + h)) - loss(eqx.tree_at(where, mech, value - h))
        ) / (2 * jnp.linalg.norm(h))
        gradient = where(grads) if h.ndim == 0 else where(grads) @ h / jnp.linalg.norm(h)
        assert abs(float(diff)) > 1e-3
        np.testing.assert_allclose(gradient, diff, rtol=1e-5)


@pytest.mark.slow
def test_markers_one_by_one_and_together_agree_with_the_rotation():
    """`Kinematics.frame` and `frames` (one marker, and many stacked) give the point
    `r + R s`, the rotation `R` and the velocity `d/dt (r + R s)`, planar (`R(θ) s` written
    out from `cos θ`, `sin θ`) and spatial."""
    rng = np.random.default_rng(2)
    for mech in (mixed_chain(3), spatial_chain(2)):
        q = np.asarray(mech.reference_coordinates())
        q = q + 0.3 * rng.standard_normal(q.shape[0])
        v = rng.standard_normal(q.shape[0])
        if mech.dimension == 3:  # unit Euler parameters p and rates with pᵀṗ = 0
            qs, vs = q.reshape(-1, 7), v.reshape(-1, 7)
            qs[:, 3:] /= np.linalg.norm(qs[:, 3:], axis=1, keepdims=True)
            vs[:, 3:] -= np.sum(vs[:, 3:] * qs[:, 3:], axis=1, keepdims=True) * qs[:, 3:]
        q, v = jnp.asarray(q), jnp.asarray(v)
        refs = ["ground"] + [f"{b.name}{m}" for b in mech.bodies for m in ("", ".a", ".b")]
        kin = Kinematics(mech, 0.0, q, v)
        together, (velocities, _) = kin.frames(refs), kin.velocities(refs)

        def points(q_):
            return jnp.stack([Kinematics(mech, 0.0, q_).frame(ref).point for ref in refs])  # noqa: B023

        rates = jax.jvp(points, (q,), (v,))[1]
        for k, ref in enumerate(refs):
            one = kin.frame(ref)
            name, _, marker = ref.partition(".")
            if name == "ground":
                rot, expected = np.eye(mech.dimension), np.zeros(mech.dimension)
            else:
                r, rot = mech.body(name).pose(mech.body_coordinates(q, name))
                s = mech.body(name).markers[marker] if marker else jnp.zeros(mech.dimension)
                expected = r + rot @ s
            for frame in (one, jax.tree.map(lambda x, k=k: x[k], together)):
                np.testing.assert_allclose(frame.point, expected, atol=1e-14)
                np.testing.assert_allclose(frame.rotation, rot, atol=1e-14)
            np.testing.assert_allclose(kin.velocity(ref)[0], rates[k], atol=1e-13)
            np.testing.assert_allclose(velocities[k], rates[k], atol=1e-13)


# -- chains of uniform links, built and by hand ------------------------------------------


def chain(n):
    ends = {"a": (-HALF, 0.0), "b": (HALF, 0.0)}
    bodies = [mb.PlanarBody(f"l{i}", 1.0, 0.05, markers=ends) for i in range(n)]
    joints = [mb.Revolute("ground", "l0.a")] + [
        mb.Revolute(f"l{i - 1}.b", f"l{i}.a") for i in range(1, n)
    ]
    return mb.Mechanism(bodies, joints, [mb.Gravity()])


class HandChain(jaxdae.LagrangianSystem):
    """The uniform chain, vectorized over the links as one writes it by hand."""

    masses: jax.Array
    inertias: jax.Array

    def mass_matrix(self, t, q):
        return jnp.diag(jnp.stack([self.masses, self.masses, self.inertias], 1).reshape(-1))

    def potential_energy(self, t, q):
        return G * jnp.sum(self.masses * q.reshape(-1, 3)[:, 1])

    def constraints(self, t, q):
        b = q.reshape(-1, 3)
        arm = jnp.stack([HALF * jnp.cos(b[:, 2]), HALF * jnp.sin(b[:, 2])], 1)
        a_ends, b_ends = b[:, :2] - arm, b[:, :2] + arm
        return jnp.concatenate([a_ends[0], (a_ends[1:] - b_ends[:-1]).reshape(-1)])


def hand_chain(n):
    return HandChain(masses=jnp.ones(n), inertias=jnp.full(n, 0.05))


def _chain_state(n):
    angles = np.full(n, -0.5)
    centres = (np.arange(n)[:, None] * 2 + 1) * HALF * np.array([np.cos(-0.5), np.sin(-0.5)])
    return jnp.asarray(np.concatenate([centres, angles[:, None]], 1).reshape(-1)), jnp.zeros(3 * n)


def test_built_chain_hands_the_core_the_hand_written_structure():
    """Above `STRUCTURED_MIN` coordinates the core finds the terms' sparsity from the
    traced functions: the built chain gives the same patterns, colourings and band as the
    hand-written one (4 colours, `J Jᵀ` of half-bandwidth 3), and the same terms."""
    n = 20
    q, v = _chain_state(n)
    t = jnp.asarray(0.0)
    built, hand = terms_structure(chain(n), t, q, v), terms_structure(hand_chain(n), t, q, v)
    assert built is not None and hand is not None
    assert built.jacobian == hand.jacobian and built.mass == hand.mass
    assert built.mass.is_diagonal and built.mass_is_constant and hand.mass_is_constant
    assert built.num_position_colours == hand.num_position_colours == 4
    mask = built.jacobian.mask().astype(int)
    gram = Pattern.from_mask(mask @ mask.T > 0)
    plan = banded_plan(gram)
    assert plan is not None and plan.width == 3
    accelerations = eqx.filter_jit(_accelerations)
    (qdd_b, lam_b), (qdd_h, lam_h) = (
        accelerations(chain(n), q, v),
        accelerations(hand_chain(n), q, v),
    )
    np.testing.assert_allclose(qdd_b, qdd_h, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(lam_b, lam_h, rtol=1e-10, atol=1e-10)


def _size(fn, *args):
    return sum(1 for _ in equations(jax.make_jaxpr(fn)(*args).jaxpr))


def spatial_chain(n):
    ends = {"a": (0.0, 0.0, 0.1), "b": (0.0, 0.0, -0.1)}
    bodies = [
        mb.RigidBody(
            f"l{i}", 1.0, (0.01, 0.01, 0.002), markers=ends, position=(0.0, 0.0, -0.2 * i - 0.1)
        )
        for i in range(n)
    ]
    joints = [mb.Revolute("ground", "l0.a", axis=(1.0, 0.0, 0.0))] + [
        mb.Spherical(f"l{i - 1}.b", f"l{i}.a") for i in range(1, n)
    ]
    springs = [mb.SpringDamper(f"l{i - 1}.a", f"l{i}.b", 10.0, 0.1, 0.2) for i in range(1, n)]
    return mb.Mechanism(bodies, joints, [mb.Gravity(), *springs])


def _method_size(method, t, *args):
    return _size(lambda *a: method(t, *a), *args)


@pytest.mark.perf(reason="pins the size of the traced equations of a built chain")
def test_traced_size_does_not_grow_with_the_links():
    """Joints, bodies and force elements of one kind are traced once per group: the
    mechanism's functions have the same number of equations for 12 and 32 links, planar and
    spatial (groups of more than 8 markers, see `_kinematics._apply`), and so has the
    right-hand side for 20 and 40 links (where the core takes the structured terms and the
    banded factorization of `J M⁻¹ Jᵀ` for both), at most 150 equations more than the
    hand-written chain's (502 against 381: what the multibody layer adds)."""
    t = jnp.asarray(0.0)
    sizes = {}
    for n in (12, 32):
        mech = chain(n)
        q, v = _chain_state(n)
        sizes[n] = [
            _method_size(getattr(mech, name), t, q)
            for name in ("constraints", "mass_matrix", "potential_energy")
        ]
        sizes[n].append(_method_size(mech.generalized_forces, t, q, v))
    assert sizes[12] == sizes[32], sizes
    spatial = {}
    for n in (12, 32):  # rigid bodies, spherical joints, spring-dampers between the links
        mech = spatial_chain(n)
        q = mech.reference_coordinates()
        spatial[n] = [
            _method_size(getattr(mech, name), t, q)
            for name in ("constraints", "mass_matrix", "potential_energy")
        ]
        spatial[n].append(_method_size(mech.generalized_forces, t, q, jnp.zeros_like(q)))
    assert spatial[12] == spatial[32], spatial
    rhs = {}
    for n in (20, 40):
        q, v = _chain_state(n)
        for which, model in (("built", chain(n)), ("hand", hand_chain(n))):
            rhs[which, n] = _size(
                lambda q_, v_, m=model: BAUMGARTE.accelerations(m.terms(t, q_, v_)), q, v
            )
    assert rhs["built", 20] == rhs["built", 40], rhs
    assert rhs["built", 40] <= rhs["hand", 40] + 150, rhs


class _OneRowTooFew(mb.AbstractJoint):
    """A joint whose residual disagrees with its `num_equations`."""

    a: str = eqx.field(static=True)
    b: str = eqx.field(static=True)
    name: str | None = eqx.field(static=True, default=None)
    num_equations: ClassVar[int] = 2

    def residual(self, t, a, b):
        return (b.point - a.point)[:1]


@pytest.mark.parametrize("count", [1, 3])
def test_a_residual_of_the_wrong_size_is_refused(count):
    """Alone or in a group, a joint whose residual has fewer rows than it declares."""
    mech = chain(3)
    mech = mb.Mechanism(
        mech.bodies,
        [_OneRowTooFew("ground", "l0.a")]
        + [_OneRowTooFew(f"l{i - 1}.b", f"l{i}.a") for i in range(1, count)],
    )
    with pytest.raises(ValueError, match="gave 1 equations where its `equations` says 2"):
        mech.constraints(0.0, mech.reference_coordinates())
