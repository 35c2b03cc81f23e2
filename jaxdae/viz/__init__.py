"""Seeing the motion: plots of a solution, animations of planar mechanisms and a 3-D viewer
of spatial ones.

An optional part of jaxdae (`pip install jaxdae[viz]`): importing it (as `import jaxdae`
does) does not import matplotlib or the viewer's library until a function here is called.
It sits above what it draws: the core does not import it, and `Solution.plot` reaches
`plot_solution` through the registration that importing it makes.
"""

from ._animate import Animation as Animation, animate as animate
from ._plots import plot_solution as plot_solution
from ._viewer import Viewer as Viewer, view as view
