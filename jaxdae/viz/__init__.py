"""Seeing the motion: plots of a solution, animations of planar mechanisms and a 3-D viewer
of spatial ones.

An optional part of jaxdae (`pip install jaxdae[viz]`): `import jaxdae` does not import it,
and importing it does not import matplotlib or the viewer's library until a function here
is called.
"""

from ._animate import Animation as Animation, animate as animate
from ._plots import plot_solution as plot_solution
from ._viewer import Viewer as Viewer, view as view
