"""The package's layering, read from its own source: no import cycles, and every import points down.

Layers, lowest first (a module may import its own unit and the layers below it):

0. ``tvm_combiners.errors``, ``tvm_combiners.startup``, ``tvm_combiners.core``: errors, process start-up
   (TVM's import without torch) and the IR-neutral algorithms;
1. ``tvm_combiners.relax``, ``tvm_combiners.relay``: the adapters and the public passes;
2. ``tvm_combiners.compile``: targets, runners, default schedules, pipelines, tuning;
3. ``tvm_combiners.collectives``: the ops, their combiners, the runtime;
4. ``tvm_combiners.models``: the ONNX loader and the model generators;
5. ``tvm_combiners.app``: the CLI, the main job, the examples (only ``python -m tvm_combiners`` imports it).

Every import counts, also one inside a function and ``importlib.import_module("literal")``.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tvm_combiners"

#: Layers, lowest first; units of one layer do not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("tvm_combiners.errors", "tvm_combiners.startup", "tvm_combiners.core"),
    ("tvm_combiners.relax", "tvm_combiners.relay"),
    ("tvm_combiners.compile",),
    ("tvm_combiners.collectives",),
    ("tvm_combiners.models",),
    ("tvm_combiners.app",),
    ("tvm_combiners.__main__",),
)


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _known(name: str) -> str | None:
    """The package module ``name`` refers to (an attribute of a module names that module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(module: str, node: ast.AST) -> list[str]:
    """The dotted names an import statement (or an ``importlib.import_module`` call) brings in."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".")
            if MODULES[module].name != "__init__.py":
                base.pop()
            base = base[:len(base) - node.level + 1]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        return [f"{prefix}.{alias.name}" for alias in node.names]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        name = node.args[0].value
        if name.startswith("."):  # import_module("..x", __package__)
            level = len(name) - len(name.lstrip("."))
            package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
            name = ".".join(package.split(".")[:len(package.split(".")) - level + 1] + [name.lstrip(".")])
        return [name]
    return []


def import_graph() -> dict[str, set[str]]:
    """Package module -> the package modules it imports."""
    graph = {}
    for module, path in MODULES.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for name in _targets(module, node):
                target = _known(name) if name.startswith("tvm_combiners") else None
                if target is not None and target != module:
                    edges.add(target)
        graph[module] = edges
    return graph


def _unit(module: str) -> tuple[int, str]:
    """(layer, unit) of a module; the package's own ``__init__`` is the lowest."""
    for level, units in enumerate(LAYERS):
        for unit in units:
            if module == unit or module.startswith(unit + "."):
                return level, unit
    if module == "tvm_combiners":
        return 0, module
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a higher layer, or of another unit of the same layer."""
    wrong = []
    for module, targets in sorted(graph.items()):
        level, unit = _unit(module)
        for target in sorted(targets):
            their_level, their_unit = _unit(target)
            if their_level > level or (their_level == level and their_unit != unit and their_unit != "tvm_combiners"):
                wrong.append(f"{module} -> {target}")
    return wrong


def missing_modules() -> list[str]:
    """Package modules imported from that do not exist (``from ..relay.runner import x`` after a move)."""
    missing = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                name = _targets(module, node)[0].rpartition(".")[0]
            elif isinstance(node, ast.Import):
                name = node.names[0].name
            else:
                continue
            if name.startswith("tvm_combiners") and name not in MODULES:
                missing.append(f"{module}: {name}")
    return missing


def test_every_imported_package_module_exists():
    assert missing_modules() == []


def test_every_module_belongs_to_a_layer():
    for module in MODULES:
        _unit(module)


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_no_module_imports_a_layer_above_its_own():
    assert upward(import_graph()) == []


def test_the_checks_see_a_cycle_and_an_upward_import():
    graph = {"tvm_combiners.core.a": {"tvm_combiners.app.cli"}, "tvm_combiners.app.cli": {"tvm_combiners.core.a"}}
    assert cycles(graph) == [["tvm_combiners.app.cli", "tvm_combiners.core.a"]]
    assert upward(graph) == ["tvm_combiners.core.a -> tvm_combiners.app.cli"]
    assert upward({"tvm_combiners.relax.x": {"tvm_combiners.relay.y"}, "tvm_combiners.relay.y": set()}) == [
        "tvm_combiners.relax.x -> tvm_combiners.relay.y"]


def test_function_level_and_importlib_imports_count(tmp_path):
    source = ("import importlib\n"
              "def f():\n    from ..collectives import spec\n"
              "def g():\n    return importlib.import_module('tvm_combiners.app.cli')\n")
    tree = ast.parse(source)
    names = [name for node in ast.walk(tree) for name in _targets("tvm_combiners.compile.host", node)]
    assert "tvm_combiners.collectives.spec" in names and "tvm_combiners.app.cli" in names
    call = ast.parse("importlib.import_module('..relax', __package__)").body[0].value
    assert _targets("tvm_combiners.collectives.relax.combiners", call) == ["tvm_combiners.collectives.relax"]


def test_every_package_folder_has_an_init():
    """``find_packages`` installs only folders with an ``__init__.py``: a namespace folder would be left out."""
    folders = {path.parent for path in PACKAGE.rglob("*.py")}
    assert sorted(str(f.relative_to(PACKAGE)) for f in folders if not (f / "__init__.py").exists()) == []
