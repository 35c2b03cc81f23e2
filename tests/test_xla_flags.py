"""What importing jaxdae changes in JAX, and its opt-outs (`jaxdae/_compilation/_xla_flags.py`):
float64, XLA's option that compiles while loops as single CPU kernels, and the disabled pass
that would hand matrix products inside them to a library."""

import json
import os
import subprocess
import sys

import pytest

import jaxdae  # noqa: F401  (sets the option on import)
from jaxdae._compilation._xla_flags import (
    DOT_LIBRARY_PASS,
    SMALL_LOOP_BYTES,
    SMALL_LOOP_OPTION,
    with_small_loop_option,
    without_dot_library_pass,
)

OPTION = f"{SMALL_LOOP_OPTION}={SMALL_LOOP_BYTES}"
PASS = f"--xla_disable_hlo_passes={DOT_LIBRARY_PASS}"
_VARIABLES = ("XLA_FLAGS", "JAXDAE_SET_XLA_FLAGS", "JAXDAE_ENABLE_X64", "JAX_ENABLE_X64")


def _fresh_env(**variables) -> dict:
    """This process's environment without jaxdae's and JAX's settings, plus `variables`."""
    env = {k: v for k, v in os.environ.items() if k not in _VARIABLES}
    return env | variables


def _import_in_a_new_process(**variables) -> dict:
    """JAX's float64 setting before and after `import jaxdae`, and `XLA_FLAGS` after it, in a
    new Python process whose environment sets `variables`."""
    code = (
        "import json, os, jax; before = jax.config.jax_enable_x64; import jaxdae; "
        "print(json.dumps({'x64 before': before, 'x64': jax.config.jax_enable_x64, "
        "'XLA_FLAGS': os.environ.get('XLA_FLAGS')}))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        env=_fresh_env(**variables),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "variables, x64, flags",
    [
        ({}, True, f"--xla_backend_extra_options={OPTION} {PASS}"),
        pytest.param(
            {"JAXDAE_ENABLE_X64": "0"},
            False,
            f"--xla_backend_extra_options={OPTION} {PASS}",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            {"JAX_ENABLE_X64": "0"},
            False,
            f"--xla_backend_extra_options={OPTION} {PASS}",
            marks=pytest.mark.slow,
        ),
        ({"JAXDAE_SET_XLA_FLAGS": "0"}, True, None),
        (
            {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
            True,
            f"--xla_force_host_platform_device_count=2 --xla_backend_extra_options={OPTION} {PASS}",
        ),
    ],
    ids=[
        "default",
        "JAXDAE_ENABLE_X64=0",
        "JAX_ENABLE_X64=0",
        "JAXDAE_SET_XLA_FLAGS=0",
        "XLA_FLAGS given",
    ],
)
def test_what_importing_changes_and_the_opt_outs(variables, x64, flags):
    imported = _import_in_a_new_process(**variables)
    assert imported == {"x64 before": False, "x64": x64, "XLA_FLAGS": flags}


def test_the_option_joins_the_flags_given():
    assert with_small_loop_option("") == f"--xla_backend_extra_options={OPTION}"
    assert with_small_loop_option("--xla_force_host_platform_device_count=4") == (
        f"--xla_force_host_platform_device_count=4 --xla_backend_extra_options={OPTION}"
    )
    # The option joins the last `--xla_backend_extra_options`: the user's options stay.
    assert with_small_loop_option(
        "--xla_backend_extra_options=a=1 --xla_backend_extra_options=b=2"
    ) == (f"--xla_backend_extra_options=a=1 --xla_backend_extra_options=b=2,{OPTION}")
    # A threshold the user chose (here XLA's default, 1024 bytes) is kept.
    mine = f"--xla_backend_extra_options={SMALL_LOOP_OPTION}=1024"
    assert with_small_loop_option(mine) == mine


def test_the_disabled_pass_joins_the_passes_given():
    assert without_dot_library_pass("") == PASS
    assert without_dot_library_pass("--xla_disable_hlo_passes=a,b") == (
        f"--xla_disable_hlo_passes=a,b,{DOT_LIBRARY_PASS}"
    )
    assert without_dot_library_pass(PASS) == PASS


@pytest.mark.skipif(os.environ.get("JAXDAE_SET_XLA_FLAGS") == "0", reason="opted out")
@pytest.mark.usefixtures("on_cpu")
def test_no_matrix_product_leaves_a_loop_for_a_library():
    """A matrix product of 10 × 10 matrices inside a loop stays XLA's own (no library
    fusion): the loop can run as one kernel."""
    import jax
    import jax.numpy as jnp

    def loop(a):
        return jax.lax.fori_loop(0, 3, lambda i, x: jnp.tanh(x @ a), a)

    compiled = jax.jit(loop).lower(jnp.ones((10, 10))).compile().as_text()
    assert "kind=kCustom" not in compiled


@pytest.mark.skipif(os.environ.get("JAXDAE_SET_XLA_FLAGS") == "0", reason="opted out")
def test_set_in_this_process():
    assert SMALL_LOOP_OPTION in os.environ.get("XLA_FLAGS", "")


def test_warns_when_imported_after_a_computation():
    code = "import jax; jax.numpy.ones(1).block_until_ready(); import jaxdae"
    run = subprocess.run(
        [sys.executable, "-c", code], env=_fresh_env(), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert "imported after JAX started its backend" in run.stderr
    assert OPTION in run.stderr  # the message gives the setting
