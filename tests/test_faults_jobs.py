"""Faults in long jobs: mismatched and damaged checkpoints of `batch_map` and `tune`, bad
members of a batch or a tuning run, and a kill (`SIGKILL`) at several points of a long job,
resumed to the results of an uninterrupted run, bit for bit."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxdae


# --- batch_map: a sweep's identity -------------------------------------------------------

def _scaled(scale):
    """The same function (name and code) closing over another value."""
    def sweep(x):
        return jnp.sin(x) * scale

    return sweep


def _bound(x, scale):
    return jnp.cos(x) * scale


XS = jnp.linspace(0.0, 1.0, 10)


def _sweep(fn, directory, *args, **kwargs):
    return jaxdae.batch_map(fn, *(args or (XS,)), chunk_size=4, checkpoint=directory,
                            progress=False, **kwargs)


@pytest.mark.parametrize("make", [
    lambda value: _scaled(value),                        # a Python float closed over
    lambda value: _scaled(jnp.array([value, 1.0])[0]),   # an array closed over
    lambda value: eqx.Partial(_bound, scale=jnp.asarray(value)),  # an eqx.Partial argument
])
def test_a_changed_closure_is_another_sweep(tmp_path, make):
    directory = tmp_path / "sweep"
    first = _sweep(make(1.0), directory)
    np.testing.assert_allclose(first, jaxdae.batch_map(make(1.0), XS))
    stamps = [path.stat().st_mtime_ns for path in sorted(directory.glob("chunk_*.npz"))]
    assert len(stamps) == 3
    # The same closure resumes (nothing computed again) ...
    again = _sweep(make(1.0), directory)
    np.testing.assert_array_equal(again, first)
    assert stamps == [path.stat().st_mtime_ns for path in sorted(directory.glob("chunk_*.npz"))]
    # ... another value of it is refused, not answered with the old chunks.
    with pytest.raises(ValueError, match=f"{directory} holds the chunks of another sweep "
                                         r"\(another function .*Use another `checkpoint`"):
        _sweep(make(2.0), directory)


def test_a_changed_simulation_end_is_another_sweep(tmp_path):
    """The reported case: the end time of the simulations, closed over, changed."""
    system = jaxdae.examples.CartesianPendulum()

    def make(t1):
        def final_state(angle):
            q0, v0 = system.state_from_angle(angle, 0.0)
            return jaxdae.simulate(system, jaxdae.Baumgarte(4.0, 4.0), 0.0, t1, q0, v0,
                                   throw=False, rtol=1e-5, atol=1e-7).q[-1]

        return final_state

    angles = jnp.array([0.2, 0.4, 0.6])
    directory = tmp_path / "sweep"
    jaxdae.batch_map(make(0.5), angles, checkpoint=directory, progress=False)
    with pytest.raises(ValueError, match="another function"):
        jaxdae.batch_map(make(1.0), angles, checkpoint=directory, progress=False)


def test_other_arguments_or_layout_name_what_differs(tmp_path):
    directory = tmp_path / "sweep"
    _sweep(_scaled(1.0), directory)
    with pytest.raises(ValueError, match=r"another sweep \(other arguments\)"):
        _sweep(_scaled(1.0), directory, XS + 1)
    with pytest.raises(ValueError, match=r"another sweep \(.*another batch size, chunk size"):
        jaxdae.batch_map(_scaled(1.0), XS, chunk_size=5, checkpoint=directory, progress=False)


# --- batch_map: damaged files --------------------------------------------------------------

def test_a_damaged_chunk_is_computed_again(tmp_path):
    directory = tmp_path / "sweep"
    fn = _scaled(3.0)
    full = _sweep(fn, directory)
    first, second = directory / "chunk_000000.npz", directory / "chunk_000001.npz"
    stamp = first.stat().st_mtime_ns
    second.write_bytes(second.read_bytes()[:40])  # truncated
    with pytest.warns(UserWarning, match="chunk_000001.npz is damaged.*computed again"):
        resumed = _sweep(fn, directory)
    np.testing.assert_array_equal(resumed, full)
    assert first.stat().st_mtime_ns == stamp  # the intact chunk is kept
    np.load(second).close()  # and the damaged one is whole again
    second.write_bytes(b"")  # an empty file
    with pytest.warns(UserWarning, match="chunk_000001.npz is damaged"):
        np.testing.assert_array_equal(_sweep(fn, directory), full)


def test_a_damaged_sweep_file_is_written_again_keeping_the_chunks(tmp_path):
    directory = tmp_path / "sweep"
    fn = _scaled(3.0)
    full = _sweep(fn, directory)
    stamps = [path.stat().st_mtime_ns for path in sorted(directory.glob("chunk_*.npz"))]
    meta = directory / "sweep.json"
    meta.write_text(meta.read_text()[:25])
    with pytest.warns(UserWarning, match="sweep.json is damaged.*chunks of this sweep on disk "
                                         "are kept"):
        resumed = _sweep(fn, directory)
    np.testing.assert_array_equal(resumed, full)
    assert stamps == [path.stat().st_mtime_ns for path in sorted(directory.glob("chunk_*.npz"))]
    json.loads(meta.read_text())
    # With another sweep's chunks next to a damaged (or missing) sweep.json: refused.
    meta.write_text("{")
    with pytest.raises(ValueError, match="holds the chunks of another sweep.*sweep.json is "
                                         "damaged"):
        _sweep(_scaled(4.0), directory)
    meta.unlink()
    with pytest.raises(ValueError, match="sweep.json is missing"):
        _sweep(_scaled(4.0), directory)
