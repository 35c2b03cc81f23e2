"""jaxdae's modules depend only downward: each layer imports only the layers below it, no
module imports another in a cycle, and private names of JAX, equinox and diffrax are used
only through `jaxdae/_compilation/_private_apis.py`.

The imports are read from the source with `ast`, those inside functions included: a lazy
import is a dependency as much as one at the top of a module."""

import ast
from pathlib import Path
from typing import NamedTuple

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "jaxdae"


class Layer(NamedTuple):
    name: str
    modules: tuple[str, ...]  # dotted names; a package holds its submodules
    imports: tuple[str, ...]  # the other layers it may import


# Bottom to top. A module imports its own layer and the layers named beside it, nothing else.
LAYERS = (
    Layer("types", ("jaxdae._custom_types",), ()),
    # Helpers that know no model: checks, thresholds, compilation, and the outcomes of a
    # solve (`RESULTS`, the solution types), which the formulations name their failures by.
    Layer(
        "base",
        (
            "jaxdae._thresholds",
            "jaxdae._gains",
            "jaxdae._checks",
            "jaxdae._compilation",
            "jaxdae._solution",
        ),
        ("types",),
    ),
    Layer("systems", ("jaxdae._systems",), ("types", "base")),
    Layer("formulations", ("jaxdae._formulations",), ("types", "base", "systems")),
    Layer("integration", ("jaxdae._integration",), ("types", "base", "systems", "formulations")),
    Layer(
        "analysis",
        ("jaxdae._analysis",),
        ("types", "base", "systems", "formulations", "integration"),
    ),
    Layer(
        "tuning",
        ("jaxdae._tuning",),
        ("types", "base", "systems", "formulations", "integration", "analysis"),
    ),
    # Models built from parts: their product is a system; they never solve or analyse.
    Layer("multibody", ("jaxdae.multibody",), ("types", "base", "systems")),
    # Draws what the layers below produce; `Solution.plot` reaches it through the
    # registration that importing it makes, so that nothing below imports it.
    Layer(
        "viz",
        ("jaxdae.viz",),
        ("types", "base", "systems", "formulations", "integration", "multibody"),
    ),
    # Models only: built from systems and multibody parts, naming (not running) the
    # formulation a paper prescribes. (Not from `jaxdae` itself, which imports them.)
    Layer("examples", ("jaxdae.examples",), ("types", "systems", "formulations", "multibody")),
    # `jaxdae/__init__.py` and the public modules beside it.
    Layer(
        "public",
        ("jaxdae",),
        (
            "types",
            "base",
            "systems",
            "formulations",
            "integration",
            "analysis",
            "tuning",
            "multibody",
            "viz",
            "examples",
        ),
    ),
)

# The one home of private upstream names, and what counts as one: a module of JAX, equinox
# or diffrax (or of lineax, optimistix, optax) whose path has a private part, and the
# private attributes of equinox's enumerations and jitted functions.
PRIVATE_APIS = "jaxdae._compilation._private_apis"
UPSTREAM = ("jax", "jaxlib", "equinox", "diffrax", "lineax", "optimistix", "optax")
PRIVATE_MODULES = ("equinox.internal",)
PRIVATE_ATTRIBUTES = ("_value", "_index_to_message", "__wrapped__")
# Private names allowed outside `_private_apis.py`, by module: none.
EXCEPTIONS: dict[str, set[str]] = {}


def _module_names() -> dict[str, Path]:
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


MODULES = _module_names()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The absolute names that `node` in `module` imports: for `from X import y`, `X.y` if
    that is a module, else `X`."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".")
        if MODULES[module].name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    return [
        f"{base}.{alias.name}"
        if f"{base}.{alias.name}" in MODULES or base.split(".")[0] in UPSTREAM
        else base
        for alias in node.names
    ]


def _imports(module: str) -> dict[str, int]:
    """Every name `module` imports (at any depth of its code), with the line of its first
    import."""
    found: dict[str, int] = {}
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for name in _imported(module, node):
                found.setdefault(name, node.lineno)
    return found


def _jaxdae_module(name: str) -> str | None:
    """The jaxdae module that importing `name` runs (the closest that exists)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


GRAPH = {
    module: {
        target: line
        for name, line in _imports(module).items()
        if (target := _jaxdae_module(name)) is not None and target != module
    }
    for module in MODULES
}


def _layer(module: str) -> Layer:
    matches = [
        (len(prefix), layer)
        for layer in LAYERS
        for prefix in layer.modules
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} is in no layer: add it to LAYERS in {__file__}"
    return max(matches, key=lambda match: match[0])[1]


def test_layers_are_declared_bottom_to_top():
    names = [layer.name for layer in LAYERS]
    assert len(set(names)) == len(names)
    for i, layer in enumerate(LAYERS):
        assert set(layer.imports) <= set(names[:i]), f"{layer.name} imports a layer above it"
    for module in MODULES:
        _layer(module)


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
def test_each_layer_imports_only_the_layers_below(layer):
    allowed = {layer.name, *layer.imports}
    wrong = [
        f"{module} imports {target} (line {line}, layer {_layer(target).name})"
        for module in MODULES
        if _layer(module) is layer
        for target, line in GRAPH[module].items()
        if _layer(target).name not in allowed
    ]
    assert not wrong, f"the {layer.name} layer may import only {sorted(allowed)}:\n" + "\n".join(
        wrong
    )


def test_no_import_cycle():
    """Depth-first search for a back edge; the cycle it closes is named in full."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[module] = "done"
        path.pop()
        return None

    for module in sorted(MODULES):
        if module not in state and (cycle := visit(module)):
            lines = [
                f"{a} (line {GRAPH[a][b]}) -> {b}"
                for a, b in zip(cycle[:-1], cycle[1:], strict=True)
            ]
            pytest.fail(
                "import cycle (module-level and function-level imports):\n" + "\n".join(lines)
            )


def _private_uses(module: str) -> dict[str, int]:
    """The private upstream names that `module` uses: modules by name, attributes as
    `.name`, with the line of the first use."""
    uses: dict[str, int] = {}
    for name, line in _imports(module).items():
        top, *rest = name.split(".")
        private = next((p for p in PRIVATE_MODULES if name == p or name.startswith(p + ".")), None)
        if top in UPSTREAM and (private or any(part.startswith("_") for part in rest)):
            uses.setdefault(private or name, line)
    for node in ast.walk(TREES[module]):
        attribute = None
        if isinstance(node, ast.Attribute):
            attribute = node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
        ):
            attribute = node.args[1].value
        if attribute in PRIVATE_ATTRIBUTES:
            uses.setdefault(f".{attribute}", node.lineno)
    return uses


def test_private_upstream_names_only_in_the_adapter():
    wrong = [
        f"{module}: {name} (line {line})"
        for module in MODULES
        if module != PRIVATE_APIS
        for name, line in _private_uses(module).items()
        if name not in EXCEPTIONS.get(module, set())
    ]
    assert not wrong, (
        f"private names of JAX, equinox or diffrax outside {PRIVATE_APIS} (add them there, "
        "with their reason and a test in tests/test_private_apis.py):\n" + "\n".join(wrong)
    )


def test_exceptions_are_still_needed():
    stale = {module: names - set(_private_uses(module)) for module, names in EXCEPTIONS.items()}
    assert not any(stale.values()), f"remove these from EXCEPTIONS, no longer used: {stale}"


def test_the_scan_sees_what_it_looks_for():
    """The scan finds a lazy import, a private module and a private attribute."""
    tree = ast.parse(
        "def f(x):\n    from .._solution import RESULTS\n"
        "    import equinox.internal as eqxi\n    return x.result._value\n"
    )
    TREES["jaxdae._integration._probe"] = tree
    MODULES["jaxdae._integration._probe"] = PACKAGE / "_integration" / "_probe.py"
    try:
        assert "jaxdae._solution" in _imports("jaxdae._integration._probe")
        assert set(_private_uses("jaxdae._integration._probe")) == {"equinox.internal", "._value"}
    finally:
        del TREES["jaxdae._integration._probe"], MODULES["jaxdae._integration._probe"]
