"""jaxdae's XLA option: while loops compiled as single CPU kernels (`jaxdae/_compilation/_xla_flags.py`)."""

import os
import subprocess
import sys

import pytest

import jaxdae  # noqa: F401  (sets the option on import)
from jaxdae._compilation._xla_flags import SMALL_LOOP_BYTES, SMALL_LOOP_OPTION, with_small_loop_option

OPTION = f"{SMALL_LOOP_OPTION}={SMALL_LOOP_BYTES}"


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


@pytest.mark.skipif(os.environ.get("JAXDAE_SET_XLA_FLAGS") == "0", reason="opted out")
def test_set_in_this_process():
    assert SMALL_LOOP_OPTION in os.environ.get("XLA_FLAGS", "")


def test_warns_when_imported_after_a_computation():
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXDAE_SET_XLA_FLAGS")}
    code = "import jax; jax.numpy.ones(1).block_until_ready(); import jaxdae"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert "imported after JAX started its backend" in run.stderr
    assert OPTION in run.stderr  # the message gives the setting
