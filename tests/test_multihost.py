"""`jaxdae.batch_map` over two processes joined by `jax.distributed` (the multi-host recipe
of docs/guides/tuning_and_batches.md), on the CPU: two worker processes
(`tests/_multihost_worker.py`) with two devices each, gloo collectives."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae

SYSTEM = jaxdae.examples.CartesianPendulum()


def run(kd, q0, v0):
    """One trajectory per row (gains and states batched)."""
    return jaxdae.simulate(
        SYSTEM, jaxdae.Baumgarte(kd, kd**2 / 4), 0.0, 0.5, q0, v0, throw=False, rtol=1e-7, atol=1e-9
    ).q_final


def ensemble(q0, v0):
    """A chunk of rows as one ensemble (shared steps across every device and process)."""
    return jaxdae.simulate_ensemble(
        SYSTEM,
        jaxdae.ModifiedLagrange(5.0, 10.0, 25.0),
        0.0,
        0.5,
        q0,
        v0,
        throw=False,
        rtol=1e-7,
        atol=1e-9,
    ).q_final


def batch(size=8):
    q0, v0 = jax.vmap(lambda a: SYSTEM.state_from_angle(a, 1.0))(jnp.linspace(0.1, 1.5, size))
    return jnp.linspace(1.0, 8.0, size), 1.05 * q0, v0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_batch_map_across_two_processes(tmp_path):
    worker = Path(__file__).with_name("_multihost_worker.py")
    port = str(_free_port())
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(rank), port, str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    logs = [proc.communicate(timeout=600)[0] for proc in procs]
    for proc, log in zip(procs, logs, strict=False):
        assert proc.returncode == 0, log[-3000:]
    expected = {"vmap": jaxdae.batch_map(run, *batch()), "ensemble": ensemble(*batch()[1:])}
    for rank in range(2):
        with np.load(tmp_path / f"rank{rank}.npz") as out:
            for name, value in expected.items():
                np.testing.assert_allclose(
                    out[name], value, rtol=1e-10, atol=1e-12, err_msg=f"rank {rank}, {name}"
                )
