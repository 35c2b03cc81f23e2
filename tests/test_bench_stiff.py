"""The Exudyn models of `experiments/benchmarks/bench_stiff.py` are jaxdae's models: the
flyball governor and the spring chain, built in Exudyn by the benchmark, follow jaxdae's
solution over a short horizon to within Exudyn's own discretization error."""

import sys
from pathlib import Path

import diffrax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae

exu = pytest.importorskip("exudyn", reason="exudyn is not installed: pip install exudyn")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import _common  # noqa: E402, F401  # pyright: ignore[reportMissingImports]
import bench_stiff  # noqa: E402  # pyright: ignore[reportMissingImports]

pytestmark = pytest.mark.slow  # each compiles a solve of its model (the governor: a minute)


def _jaxdae(case):
    sol = jaxdae.simulate(
        case.system,
        case.formulation,
        0.0,
        case.t1,
        case.q0,
        case.v0,
        ts=jnp.asarray(case.ts),
        solver=diffrax.Dopri8(),
        rtol=1e-11,
        atol=1e-13,
        max_steps=1_000_000,
    )
    return case.measure(np.asarray(sol.q))


@pytest.mark.parametrize(
    ("name", "setting"),
    [
        ("governor", "index 3, ρ∞ = 0.9, Newton rel. 1e-8"),
        ("chain", "index 3, ρ∞ = 0.9, Newton rel. 1e-6"),
    ],
)
def test_exudyn_model_follows_jaxdae(name, setting):
    """Over 0.1 s, Exudyn's generalized-α at h and h/2 against Dopri8 at rtol 1e-11: the
    differences are small (metres for the governor; relative for the chain) and fall like
    h² (Exudyn's order), so what remains is Exudyn's error, not a different model."""
    settings = bench_stiff.FULL._replace(governor_t1=0.1, chain_t1=0.1)
    case = bench_stiff.make_cases(settings, True, False)[name]
    expected = _jaxdae(case)
    scale = 1.0 if name == "governor" else float(np.max(np.abs(expected)))
    differences = []
    for h in (2e-4, 1e-4):
        values, _, _ = bench_stiff.exudyn_run(case, setting, h).go()
        differences.append(float(np.max(np.abs(values - expected))) / scale)
    coarse, fine = differences
    assert fine < 1e-6, differences
    if coarse > 1e-8:  # above the Newton tolerance's own error, Exudyn's second-order one
        assert 2.5 < coarse / fine < 6.0, differences
