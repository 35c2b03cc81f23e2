"""Controllers that wrap another: their base, the controller inside the wrappers, and the
times at which a controller steps across a discontinuity. The problem stage resolves a
solve's step options (`_problem.step_options`); the integration wraps its controller to
stop stalled steps (`_solve.StopStalledSteps`)."""

import functools

import diffrax
import equinox as eqx

from .._custom_types import Array
from ._forwarding import Forwarded


class AbstractControllerWrapper(diffrax.AbstractAdaptiveStepSizeController):
    """An adaptive controller that wraps another: the tolerances and the error norm are
    the wrapped controller's."""

    controller: eqx.AbstractVar[diffrax.AbstractAdaptiveStepSizeController]
    rtol = Forwarded("controller")
    atol = Forwarded("controller")
    norm = Forwarded("controller")


@functools.singledispatch
def jump_times(controller: diffrax.AbstractStepSizeController) -> Array | None:
    """The times at which `controller` steps across a discontinuity (after which the solver
    re-evaluates a step's first stage): `diffrax.ClipStepSizeController`'s `jump_ts`, those
    of the controller inside a wrapper, or None. Dispatched on the controller's class, so
    that a controller of one's own with jumps registers them."""
    del controller
    return None


jump_times.register(diffrax.ClipStepSizeController, lambda controller: controller.jump_ts)
jump_times.register(AbstractControllerWrapper, lambda controller: jump_times(controller.controller))


def inner_controller(
    controller: diffrax.AbstractStepSizeController,
) -> diffrax.AbstractStepSizeController:
    """The controller inside `controller`'s wrappers (`diffrax.ClipStepSizeController`,
    jaxdae's `AbstractControllerWrapper`)."""
    while isinstance(controller, diffrax.ClipStepSizeController | AbstractControllerWrapper):
        controller = controller.controller
    return controller
