"""What importing jaxdae changes in JAX, and its opt-outs (`jaxdae/_compilation/_xla_flags.py`):
float64, and XLA's options that compile while loops as single CPU kernels."""

import json
import os
import subprocess
import sys

import pytest

import jaxdae  # noqa: F401  (sets the option on import)
from jaxdae._compilation._xla_flags import (
    LIBRARY_FUSION_OPTION,
    LIBRARY_FUSIONS,
    SMALL_LOOP_BYTES,
    SMALL_LOOP_OPTION,
    loop_options,
    with_small_loop_option,
)

OPTION = f"{SMALL_LOOP_OPTION}={SMALL_LOOP_BYTES}"
FUSIONS = f"--{LIBRARY_FUSION_OPTION}={LIBRARY_FUSIONS}"
OPTIONS = f"--xla_backend_extra_options={OPTION} {FUSIONS}"
_VARIABLES = ("XLA_FLAGS", "JAXDAE_SET_XLA_FLAGS", "JAXDAE_ENABLE_X64", "JAX_ENABLE_X64")


def _fresh_env(**variables) -> dict:
    """This process's environment without jaxdae's and JAX's settings, plus `variables`."""
    env = {k: v for k, v in os.environ.items() if k not in _VARIABLES}
    return env | variables


def _import_in_a_new_process(**variables) -> dict:
    """JAX's float64 setting before and after `import jaxdae`, and `XLA_FLAGS` after it, in a
    new Python process whose environment sets `variables`."""
    code = ("import json, os, jax; before = jax.config.jax_enable_x64; import jaxdae; "
            "print(json.dumps({'x64 before': before, 'x64': jax.config.jax_enable_x64, "
            "'XLA_FLAGS': os.environ.get('XLA_FLAGS')}))")
    run = subprocess.run([sys.executable, "-c", code], env=_fresh_env(**variables),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


@pytest.mark.parametrize("variables, x64, flags", [
    ({}, True, OPTIONS),
    ({"JAXDAE_ENABLE_X64": "0"}, False, OPTIONS),
    ({"JAX_ENABLE_X64": "0"}, False, OPTIONS),
    ({"JAXDAE_SET_XLA_FLAGS": "0"}, True, None),
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}, True,
     f"--xla_force_host_platform_device_count=2 {OPTIONS}"),
    ({"XLA_FLAGS": f"--{LIBRARY_FUSION_OPTION}=-individual_dot"}, True,
     f"--{LIBRARY_FUSION_OPTION}=-individual_dot --xla_backend_extra_options={OPTION}"),
], ids=["default", "JAXDAE_ENABLE_X64=0", "JAX_ENABLE_X64=0", "JAXDAE_SET_XLA_FLAGS=0",
        "XLA_FLAGS given", "library fusions given"])
def test_what_importing_changes_and_the_opt_outs(variables, x64, flags):
    imported = _import_in_a_new_process(**variables)
    assert imported == {"x64 before": False, "x64": x64, "XLA_FLAGS": flags}


def test_the_option_joins_the_flags_given():
    assert with_small_loop_option("") == f"--xla_backend_extra_options={OPTION}"
    assert with_small_loop_option("--xla_force_host_platform_device_count=4") == (
        f"--xla_force_host_platform_device_count=4 --xla_backend_extra_options={OPTION}")
    # The option joins the last `--xla_backend_extra_options`: the user's options stay.
    assert with_small_loop_option(
        "--xla_backend_extra_options=a=1 --xla_backend_extra_options=b=2") == (
        f"--xla_backend_extra_options=a=1 --xla_backend_extra_options=b=2,{OPTION}")
    # A threshold the user chose (here XLA's default, 1024 bytes) is kept.
    mine = f"--xla_backend_extra_options={SMALL_LOOP_OPTION}=1024"
    assert with_small_loop_option(mine) == mine
    # The library fusions are turned off by a flag of their own, unless the user named it.
    assert loop_options("") == OPTIONS
    assert loop_options(f"--{LIBRARY_FUSION_OPTION}=+individual_dot") == (
        f"--{LIBRARY_FUSION_OPTION}=+individual_dot --xla_backend_extra_options={OPTION}")


@pytest.mark.skipif(os.environ.get("JAXDAE_SET_XLA_FLAGS") == "0", reason="opted out")
def test_set_in_this_process():
    assert SMALL_LOOP_OPTION in os.environ.get("XLA_FLAGS", "")
    assert LIBRARY_FUSION_OPTION in os.environ.get("XLA_FLAGS", "")


def test_warns_when_imported_after_a_computation():
    code = "import jax; jax.numpy.ones(1).block_until_ready(); import jaxdae"
    run = subprocess.run([sys.executable, "-c", code], env=_fresh_env(), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "imported after JAX started its backend" in run.stderr
    assert OPTIONS in run.stderr  # the message gives the setting
