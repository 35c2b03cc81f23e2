"""The two-link example of Mukharlyamov and Deressa (2015) written out by hand (NumPy and
CasADi): the independent reference of the tests and the peers of the benchmarks.

The same equations jaxdae derives by autodiff from `TwoLinkManipulator`, written out by hand
in closed form so that SciPy and CasADi integrate an independent implementation:

- links `l1 = l`, `l2 = l/2`, masses `m1 = 2m`, `m2 = m`, centres at mid-length `c_i = l_i/2`,
  inertias `I_i = m_i l_i² / 12`, gravity `g` along −y;
- `M = [[I1 + I2 + m1 c1² + m2 (l1² + c2² + 2 l1 c2 cos q2), I2 + m2 (c2² + l1 c2 cos q2)],
        [I2 + m2 (c2² + l1 c2 cos q2), I2 + m2 c2²]]`;
- `Q = −(Coriolis/centrifugal) − ∂V/∂q` with `h = m2 l1 c2 sin q2`:
  `Q1 = h (2 v1 v2 + v2²) − g (m1 c1 + m2 l1) cos q1 − g m2 c2 cos(q1+q2)`,
  `Q2 = −h v1² − g m2 c2 cos(q1+q2)`;
- `Φ = (l1 sin q1 + l2 sin(q1+q2) − l/2, l1 cos q1 + l2 cos(q1+q2) + v t − x0)`,
  `J = Φ_q`, `Φ̇ = J q̇ + (0, v)`, `γ = (l1 sin q1 v1² + l2 sin(q1+q2) w², l1 cos q1 v1² +
  l2 cos(q1+q2) w²)` with `w = v1 + v2`;
- modified Lagrange (Mukharlyamov and Deressa (2015) eq. [30]) with `𝔄 = αI`, `K_D = diag(kd)`,
  `K_P = diag(kp)`: `(M + α JᵀJ) q̈ = Q + α Jᵀ (γ − K_D Φ̇ − K_P Φ)`.

Parameters are packed as `p = (alpha, kd1, kd2, kp1, kp2)`, the state as `y = (q1, q2, v1, v2)`.
"""

import numpy as np

LENGTH, MASS, SPEED, GRAVITY = 1.0, 1.0, 0.6, 9.81
Q0 = np.array([1.396263, 3.563268])
V0 = np.array([0.358620, -0.867745])
L1, L2 = LENGTH, LENGTH / 2
M1, M2 = 2 * MASS, MASS
C1, C2 = L1 / 2, L2 / 2
I1, I2 = M1 * L1**2 / 12, M2 * L2**2 / 12
X0 = L1 * np.cos(Q0[0]) + L2 * np.cos(Q0[0] + Q0[1])
# alpha, kd, kp of ModifiedLagrange(10, [20, 10], [100, 25])
PARAMS = np.array([10.0, 20.0, 10.0, 100.0, 25.0])


def _equations(xp, t, y, p):
    """`ẏ` of the modified Lagrange ODE; `xp` is `numpy` or `casadi` (same formulas)."""
    q1, q2, v1, v2 = y[0], y[1], y[2], y[3]
    alpha, kd1, kd2, kp1, kp2 = p[0], p[1], p[2], p[3], p[4]
    s1, c1 = xp.sin(q1), xp.cos(q1)
    s12, c12 = xp.sin(q1 + q2), xp.cos(q1 + q2)
    cos2, sin2 = xp.cos(q2), xp.sin(q2)
    w = v1 + v2
    m11 = I1 + I2 + M1 * C1**2 + M2 * (L1**2 + C2**2 + 2 * L1 * C2 * cos2)
    m12 = I2 + M2 * (C2**2 + L1 * C2 * cos2)
    m22 = I2 + M2 * C2**2
    h = M2 * L1 * C2 * sin2
    f1 = h * (2 * v1 * v2 + v2**2) - GRAVITY * ((M1 * C1 + M2 * L1) * c1 + M2 * C2 * c12)
    f2 = -h * v1**2 - GRAVITY * M2 * C2 * c12
    # J = Φ_q, rows (Φ1, Φ2)
    j11, j12 = L1 * c1 + L2 * c12, L2 * c12
    j21, j22 = -L1 * s1 - L2 * s12, -L2 * s12
    phi1 = L1 * s1 + L2 * s12 - 0.5 * LENGTH
    phi2 = L1 * c1 + L2 * c12 + SPEED * t - X0
    dphi1 = j11 * v1 + j12 * v2
    dphi2 = j21 * v1 + j22 * v2 + SPEED
    gamma1 = L1 * s1 * v1**2 + L2 * s12 * w**2
    gamma2 = L1 * c1 * v1**2 + L2 * c12 * w**2
    s_1 = gamma1 - kd1 * dphi1 - kp1 * phi1
    s_2 = gamma2 - kd2 * dphi2 - kp2 * phi2
    a11 = m11 + alpha * (j11 * j11 + j21 * j21)
    a12 = m12 + alpha * (j11 * j12 + j21 * j22)
    a22 = m22 + alpha * (j12 * j12 + j22 * j22)
    b1 = f1 + alpha * (j11 * s_1 + j21 * s_2)
    b2 = f2 + alpha * (j12 * s_1 + j22 * s_2)
    det = a11 * a22 - a12 * a12
    acc1 = (a22 * b1 - a12 * b2) / det
    acc2 = (a11 * b2 - a12 * b1) / det
    return (v1, v2, acc1, acc2), (phi1, phi2)


def numpy_rhs(p=PARAMS):
    """`f(t, y)` for `scipy.integrate.solve_ivp`."""
    p = np.asarray(p, dtype=float)

    def rhs(t, y):
        return np.array(_equations(np, t, y, p)[0])

    return rhs


def numpy_constraints(t, y):
    """`Φ(t, q)` in NumPy (the `p` argument does not enter)."""
    return np.array(_equations(np, t, y, PARAMS)[1])


def casadi_dae(ca):
    """The ODE as a CasADi SX `dae` dict `{t, x, p, ode}` plus the constraint function."""
    t = ca.SX.sym("t")
    x = ca.SX.sym("x", 4)
    p = ca.SX.sym("p", 5)
    ydot, phi = _equations(ca, t, [x[i] for i in range(4)], [p[i] for i in range(5)])
    dae = {"t": t, "x": x, "p": p, "ode": ca.vertcat(*ydot)}
    phi_fn = ca.Function("phi", [t, x], [ca.vertcat(*phi)])
    return dae, phi_fn


def perturbed_states(num: int, scale: float = 1e-2, seed: int = 0):
    """`num` initial states `(q0, v0)` (arrays `(num, 2)`), paper state plus `scale · N(0, 1)`."""
    rng = np.random.default_rng(seed)
    q = Q0 + scale * rng.standard_normal((num, 2))
    v = V0 + scale * rng.standard_normal((num, 2))
    return q, v
