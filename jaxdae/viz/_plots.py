"""Plots of a solution against time in one call: coordinates, constraint violations, energy
drift, multipliers and events, for one trajectory or a batch of them."""

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .._gains import is_concrete
from .._integration._actuated import ActuatedSolution
from .._solution import AbstractSolution, Events, Solution, plot

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_SOLUTION_FIELDS = ("q", "v", "violations", "energy", "multipliers")
_ACTUATED_FIELDS = ("q", "v", "w", "u", "violations")
# Velocities repeat what the coordinates show, so they are drawn only when asked for.
_SOLUTION_DEFAULT = ("q", "violations", "energy", "multipliers")
_ACTUATED_DEFAULT = ("q", "w", "u", "violations")

# Dashed lines in colours apart from the default cycle (`C0`, `C1`, ...) of the data.
_EVENT_COLOURS = ("crimson", "black", "goldenrod", "purple", "teal")
# Beyond this many entries a legend hides the data it explains.
_MAX_LEGEND = 12


class _Series(NamedTuple):
    label: str | None
    values: np.ndarray  # (B, N), NaN where the solution is not finite


class _Panel(NamedTuple):
    field: str
    ylabel: str
    series: list[_Series]
    log: bool = False


def _size(shape) -> int:
    return int(np.prod(shape, dtype=int))


def _rows(x, batch_ndim: int) -> np.ndarray:
    """`(*batch, N, ...)` as a float array `(B, N, ...)`, NaN where not finite (rows after a
    failure are `inf`): matplotlib leaves NaN out of lines and percentiles skip it."""
    a = np.asarray(x, dtype=float)
    a = a.reshape((_size(a.shape[:batch_ndim]),) + a.shape[batch_ndim:])
    return np.where(np.isfinite(a), a, np.nan)


def _largest(x) -> np.ndarray:
    """The largest absolute entry over the last axis; NaN where a row is not finite."""
    with warnings.catch_warnings():  # all-NaN rows after a failure stay NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.max(np.abs(x), axis=-1)


def _each(symbol: str, values: np.ndarray, labels: Sequence[str] | None = None) -> list[_Series]:
    """One series per entry of the last axis of `values` `(B, N, n)`."""
    return [
        _Series(labels[i] if labels is not None else f"${symbol}_{{{i}}}$", values[..., i])
        for i in range(values.shape[-1])
    ]


def _derivative(symbol: str, order: int) -> str:
    dotted = {0: symbol, 1: rf"\dot {symbol}", 2: rf"\ddot {symbol}"}
    return dotted.get(order, f"{symbol}^{{({order})}}")


def _solution_panels(sol: Solution, batch_ndim: int, names) -> dict[str, _Panel]:
    q, v = _rows(sol.q, batch_ndim), _rows(sol.v, batch_ndim)
    phi, dphi, psi = (_rows(x, batch_ndim) for x in (sol.phi, sol.dphi, sol.psi))
    multipliers = _rows(sol.multipliers, batch_ndim)
    energy = _rows(sol.energy, batch_ndim)
    m = phi.shape[-1]
    violations = [
        _Series(label, _largest(x))
        for label, x in ((r"$|\Phi|$", phi), (r"$|\dot\Phi|$", dphi), (r"$|\Psi|$", psi))
        if x.shape[-1]
    ]
    return {
        "q": _Panel("q", "coordinates q", _each("q", q, names)),
        "v": _Panel("v", "velocities v", _each("v", v, names)),
        "violations": _Panel(
            "violations", "constraint violation\n(largest entry)", violations, log=True
        ),
        "energy": _Panel(
            "energy", r"energy drift $E - E(t_0)$", [_Series(None, energy - energy[:, :1])]
        ),
        "multipliers": _Panel(
            "multipliers",
            "multipliers",
            _each(r"\lambda", multipliers[..., :m]) + _each(r"\mu", multipliers[..., m:]),
        ),
    }


def _actuated_panels(sol: ActuatedSolution, batch_ndim: int, names) -> dict[str, _Panel]:
    q, v = _rows(sol.q, batch_ndim), _rows(sol.v, batch_ndim)
    w, u = _rows(sol.w, batch_ndim), _rows(sol.u, batch_ndim)
    groups = sol.residuals if isinstance(sol.residuals, tuple) else (sol.residuals,)
    violations = []
    for g, residual in enumerate(groups):
        residual = _rows(residual, batch_ndim)  # (B, N, ρ, r)
        for order in range(residual.shape[-2]):
            symbol = _derivative(f"f_{{{g}}}" if len(groups) > 1 else "f", order)
            violations.append(_Series(f"$|{symbol}|$", _largest(residual[..., order, :])))
    return {
        "q": _Panel("q", "coordinates q", _each("q", q, names)),
        "v": _Panel("v", "velocities v", _each("v", v, names)),
        "w": _Panel("w", "actuator states w", _each("w", w)),
        "u": _Panel("u", "inputs u", _each("u", u)),
        "violations": _Panel(
            "violations", "program constraints\n(largest entry)", violations, log=True
        ),
    }


def _draw(
    ax: "Axes", panel: _Panel, ts: np.ndarray, max_lines: int, percentiles: tuple[float, float]
) -> None:
    lines = ts.shape[0] <= max_lines
    # Residuals that are exactly zero throughout (an exact formulation) stay on a linear axis.
    log = panel.log and any(np.any(s.values > 0) for s in panel.series)
    for i, series in enumerate(panel.series):
        colour = f"C{i % 10}"
        values = series.values
        if log:  # zeros (an exact start) have no place on a log axis
            values = np.where(values > 0, values, np.nan)
        if lines:
            single = ts.shape[0] == 1
            for b in range(ts.shape[0]):
                ax.plot(
                    ts[b],
                    values[b],
                    color=colour,
                    linewidth=1.5 if single else 0.8,
                    alpha=1.0 if single else 0.7,
                    label=series.label if b == 0 else None,
                )
        else:
            with warnings.catch_warnings():  # save times where every member failed
                warnings.simplefilter("ignore", RuntimeWarning)
                t = np.nanmedian(ts, axis=0)
                low, middle, high = np.nanpercentile(
                    values, (percentiles[0], 50.0, percentiles[1]), axis=0
                )
            ax.fill_between(t, low, high, color=colour, alpha=0.25, linewidth=0)
            ax.plot(t, middle, color=colour, linewidth=1.5, label=series.label)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(panel.ylabel)
    ax.grid(True, alpha=0.3)


def _draw_events(ax: "Axes", events: Events, batch_ndim: int, labelled: bool) -> list[str]:
    """Vertical dashed lines at the events of every member, one colour per kind; returns
    the kinds drawn."""
    batch = _size(events.t.shape[:batch_ndim])
    times = np.asarray(events.t, dtype=float).reshape((batch,) + events.t.shape[batch_ndim:])
    kinds = np.asarray(events.kind).reshape(times.shape)
    counts = np.asarray(events.count).reshape(-1)
    valid = np.arange(times.shape[-1]) < counts[:, None]
    drawn = []
    for kind, name in enumerate(Events.KIND_NAMES):
        at = times[valid & (kinds == kind)]
        at = at[np.isfinite(at)]
        if at.size:
            ax.vlines(
                at,
                0.0,
                1.0,
                transform=ax.get_xaxis_transform(),
                colors=_EVENT_COLOURS[kind],
                linestyles="--",
                linewidth=0.8,
                alpha=0.7,
                label=name if labelled else None,
            )
            drawn.append(name)
    return drawn


def _notes(sol, batch: int, lines: bool, percentiles, title: str | None) -> list[str]:
    notes = [] if title is None else [title]
    failed = int(np.sum(~np.asarray(sol.succeeded)))
    if batch > 1 and not lines:
        notes.append(
            f"median and {percentiles[0]:g}–{percentiles[1]:g} percentile band of {batch} solves"
        )
    if failed and batch == 1:
        t_final = float(np.asarray(sol.t_final).reshape(-1)[0])
        notes.append(f"the solve failed at t = {t_final:.6g} (see `result`)")
    elif failed:
        notes.append(f"{failed} of {batch} solves failed (drawn up to their failure)")
    return notes


def plot_solution(
    solution: Solution | ActuatedSolution,
    *,
    fields: Sequence[str] | None = None,
    names: Sequence[str] | None = None,
    axes: "Sequence[Axes] | Axes | None" = None,
    max_lines: int = 10,
    percentiles: tuple[float, float] = (5.0, 95.0),
    events: bool = True,
    title: str | None = None,
    figsize: tuple[float, float] | None = None,
) -> "Figure":
    """Plots a solution against time, one panel per field, on a shared time axis.

    The panels of a [`jaxdae.Solution`][]:

    - `"q"`, `"v"`: the coordinates and velocities, one line per coordinate;
    - `"violations"`: the largest entries of `|Φ|`, `|Φ̇|` and `|Ψ|` on a log scale (those
        the system has);
    - `"energy"`: the drift `E − E(t0)` of the total energy `T + V`;
    - `"multipliers"`: the holonomic multipliers `λ`, then the nonholonomic `μ`.

    The events of a system with one-sided constraints (`solution.events`: impacts,
    contacts, releases, sticks, slips) are dashed vertical lines on every panel, one colour
    per kind, named in the legend of the first panel.

    The panels of a [`jaxdae.ActuatedSolution`][]: `"q"`, `"v"`, `"w"` (the actuator
    states), `"u"` (the inputs) and `"violations"` (the largest entry of each derivative
    `f, ḟ, …, f⁽ᵖ⁻¹⁾` of the program constraints, per group, on a log scale).

    A solution with leading batch axes (from `jax.vmap(jaxdae.simulate)` or
    [`jaxdae.simulate_ensemble`][]) is drawn as one thin line per member up to
    `max_lines` members, and beyond that as the median with a band between two
    percentiles (across members at each save time; the members are assumed to share
    their save times, as with `ts=`); events are marked in the first case only. Rows
    after a failure (`inf`) are left out, and the figure's title says which solves
    failed.

    Needs matplotlib, the `viz` extra: `pip install jaxdae[viz]`.

    **Arguments:**

    - `solution`: a [`jaxdae.Solution`][] or [`jaxdae.ActuatedSolution`][], with or without
        leading batch axes.
    - `fields`: the panels, top to bottom, from those above. By default `("q",
        "violations", "energy", "multipliers")` for a `Solution` and `("q", "w", "u",
        "violations")` for an `ActuatedSolution`, less those a system does not have (no
        constraints: no violations and no multipliers).
    - `names`: one label per coordinate for the `"q"` and `"v"` panels, e.g.
        `mechanism.coordinate_names` of a [`jaxdae.multibody.Mechanism`][] or
        `model.coordinate_names` of [`jaxdae.examples.BallAndBeam`][]; by default `q₀, q₁, …`.
    - `axes`: matplotlib axes to draw into, one per panel; by default a new figure.
    - `max_lines`: the largest batch drawn as one line per member.
    - `percentiles`: the band of a larger batch, `(low, high)` in percent.
    - `events`: whether to mark the events.
    - `title`: a title for the figure.
    - `figsize`: the size of a new figure in inches; by default 8 wide and 2 per panel.

    **Returns:**

    The matplotlib `Figure`.

    **Raises:**

    - `ImportError` if matplotlib is not installed.
    - `ValueError` for an unknown field, a field the system does not have, `names` or
        `axes` of the wrong length, or bad `percentiles`.
    """
    try:
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError("Plotting needs matplotlib: `pip install jaxdae[viz]`.") from error

    chosen, batch_ndim, (low, high) = _panels(solution, fields, names, percentiles)
    # An ensemble or a vmap over states alone may share its save times: `(N,)`.
    ts = _rows(np.broadcast_to(np.asarray(solution.ts), solution.q.shape[:-1]), batch_ndim)
    figure, panel_axes = _panel_axes(plt, axes, chosen, figsize)
    lines = ts.shape[0] <= max_lines
    for i, (ax, panel) in enumerate(zip(panel_axes, chosen, strict=True)):
        _draw(ax, panel, ts, max_lines, (low, high))
        named = 0  # entries of the events in this panel's legend
        if events and lines and isinstance(solution, Solution) and solution.events is not None:
            kinds = _draw_events(ax, solution.events, batch_ndim, labelled=i == 0)
            named = len(kinds) if i == 0 else 0
        _legend(ax, named)
    panel_axes[-1].set_xlabel("time t")
    notes = _notes(solution, ts.shape[0], lines, (low, high), title)
    if notes:
        figure.suptitle("\n".join(notes), fontsize="medium")
    return figure


# `Solution.plot` and `ActuatedSolution.plot` draw with `plot_solution`.
plot.register(AbstractSolution, plot_solution)


def _panels(solution, fields, names, percentiles) -> tuple[list[_Panel], int, tuple[float, float]]:
    """The panels of `fields` (by default those of the solution's kind that have
    something to draw), the number of batch axes and the band's percentiles, checked."""
    if isinstance(solution, Solution):
        available, default, build = _SOLUTION_FIELDS, _SOLUTION_DEFAULT, _solution_panels
    elif isinstance(solution, ActuatedSolution):
        available, default, build = _ACTUATED_FIELDS, _ACTUATED_DEFAULT, _actuated_panels
    else:
        raise TypeError(
            "`solution` must be a `jaxdae.Solution` or a "
            f"`jaxdae.ActuatedSolution`; got {type(solution).__name__}."
        )
    if not is_concrete(solution):
        raise ValueError(
            "Plotting reads a concrete solution: call `plot()` on the solution returned "
            "outside `jax.jit` and `jax.vmap` (return the solution from the compiled "
            "function, then plot it)."
        )
    batch_ndim = solution.q.ndim - 2
    n = solution.q.shape[-1]
    if names is not None:
        if isinstance(names, str) or len(names) != n:
            raise ValueError(
                f"`names` must be a sequence of {n} strings, one per coordinate; got {names!r}."
            )
        names = [str(name) for name in names]
    low, high = (float(p) for p in percentiles)
    if not 0.0 <= low < high <= 100.0:
        raise ValueError(
            f"`percentiles` must be (low, high) with 0 ≤ low < high ≤ 100; got {percentiles!r}."
        )
    panels = build(solution, batch_ndim, names)
    if fields is None:
        return [panels[f] for f in default if panels[f].series], batch_ndim, (low, high)
    fields = [fields] if isinstance(fields, str) else list(fields)
    unknown = [f for f in fields if f not in available]
    if unknown:
        raise ValueError(
            f"Unknown field(s) {unknown}: a {type(solution).__name__} has {list(available)}."
        )
    empty = [f for f in fields if not panels[f].series]
    if empty:
        raise ValueError(f"This system has nothing to plot in {empty} (no constraints).")
    return [panels[f] for f in fields], batch_ndim, (low, high)


def _panel_axes(plt, axes, chosen: list[_Panel], figsize) -> tuple["Figure", list["Axes"]]:
    """The figure and one axes per panel: `axes` (checked), or a new figure's."""
    if axes is None:
        figure, grid = plt.subplots(
            len(chosen),
            1,
            sharex=True,
            squeeze=False,
            figsize=figsize or (8.0, 1.0 + 2.0 * len(chosen)),
            layout="constrained",
        )
        return figure, list(grid[:, 0])
    panel_axes = list(np.ravel(np.asarray(axes, dtype=object)))
    if len(panel_axes) != len(chosen):
        raise ValueError(
            f"`axes` must hold one axes per panel, {len(chosen)} for "
            f"{[p.field for p in chosen]}; got {len(panel_axes)}."
        )
    return panel_axes[0].figure, panel_axes


def _legend(ax: "Axes", named: int) -> None:
    """The panel's legend beside it; past `_MAX_LEGEND` entries, only the `named` last
    ones (the events', drawn last)."""
    handles, labels = ax.get_legend_handles_labels()
    if len(handles) > _MAX_LEGEND:
        handles, labels = handles[len(handles) - named :], labels[len(labels) - named :]
    if handles:
        ax.legend(
            handles,
            labels,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize="small",
            frameon=False,
        )
