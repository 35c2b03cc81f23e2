"""Drawing a solution: arguments refused with a message that names the argument and the
fix (`jaxdae/viz/_frames.py`, `_animate.py`, `_plots.py`): a batch member out of range or
not an integer, an `fps` that is not finite, another model's solution, an MP4 path that
cannot be written, and a solution traced by `jax.jit`."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib", reason="the viz extra: pip install jaxdae[viz]")
matplotlib.use("Agg")

import jaxdae  # noqa: E402
from jaxdae.examples import CartesianPendulum  # noqa: E402
from jaxdae.viz import animate  # noqa: E402

from .test_viz_animate import double_pendulum, double_pendulum_motion, parallelogram  # noqa: E402


def _batch_of_two():
    one = double_pendulum_motion(count=4)
    return SimpleNamespace(ts=np.stack([one.ts] * 2), q=np.stack([one.q] * 2))


@pytest.mark.usefixtures("unchecked")  # wrongly typed members: jaxdae's own message
def test_a_member_outside_the_batch_or_not_an_integer_is_named():
    model, batch = double_pendulum(), _batch_of_two()
    with pytest.raises(ValueError, match=r"`member=5` is out of range.*from 0 to 1"):
        animate(model, batch, member=5)
    with pytest.raises(ValueError, match=r"`member=1.7` does not index .*an integer"):
        animate(model, batch, member=1.7)
    with pytest.raises(ValueError, match=r"`member=True` does not index"):
        animate(model, batch, member=True)
    with pytest.raises(ValueError, match=r"`member=\(0, 1\)` does not index"):
        animate(model, batch, member=(0, 1))
    assert len(animate(model, batch, member=np.int64(-1), frames=2)) == 2


@pytest.mark.usefixtures("unchecked")  # "fast": jaxdae's message, not the annotation's
@pytest.mark.parametrize("fps", [np.inf, np.nan, 0.0, -1.0, "fast"])
def test_an_fps_that_is_not_finite_and_positive_is_named(fps):
    with pytest.raises(ValueError, match=r"`fps` must be a finite positive number"):
        animate(double_pendulum(), double_pendulum_motion(count=4), fps=fps)


def test_another_models_solution_is_named():
    _, other = parallelogram(count=3)
    with pytest.raises(ValueError, match=r"`solution.q` has 12 coordinates and the mechanism 6"):
        animate(double_pendulum(), other)


def test_an_mp4_that_cannot_be_written_names_the_path(tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    animation = animate(double_pendulum(), double_pendulum_motion(count=3), frames=2)
    missing = tmp_path / "missing" / "motion.mp4"
    with pytest.raises(FileNotFoundError, match=r"its folder .*missing' does not exist"):
        animation.save(missing)
    # A folder as the output file: ffmpeg cannot open it and stops taking frames.
    (tmp_path / "taken.mp4").mkdir()
    with pytest.raises(OSError, match=r"ffmpeg could not write the animation to .*taken\.mp4"):
        animation.save(tmp_path / "taken.mp4")


def test_a_traced_solution_is_refused_with_the_fix():
    motion = double_pendulum_motion(count=3)
    with pytest.raises(ValueError, match="concrete solution"):
        jax.jit(lambda q: animate(double_pendulum(), SimpleNamespace(ts=motion.ts, q=q)))(motion.q)
    pendulum = CartesianPendulum()
    q0, v0 = pendulum.state_from_angle(0.5, 0.0)
    sol = jaxdae.simulate(
        pendulum, jaxdae.Baumgarte(10.0, 25.0), 0.0, 0.1, q0, v0, ts=jnp.linspace(0.0, 0.1, 3)
    )
    with pytest.raises(ValueError, match=r"concrete solution: call `plot\(\)`"):
        jax.jit(lambda s: s.plot())(sol)
