"""The package's import graph, read from the source: no circles, the arrows between the rooms
are exactly the allowed ones (hooks -> analysis, never monitor; analysis -> shared leaves only,
with no web framework and no SQL; monitor and dashboard -> analysis; into hooks only the entry
points, integrations/ and tuning/), the collector never imports the dashboard (`serve` composes
the two), and delivery reads the step records by the shared contract
(starvewatch/record_layout.py), never by the hooks' internals.

Every import counts, also one inside a function: a deferred import is still an edge. Edges
follow what Python executes: `from pkg import name` is an edge to the submodule `pkg.name`
when there is one, otherwise to `pkg` itself (its __init__); `import a.b` is an edge to `a.b`.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import starvewatch

PACKAGE = "starvewatch"
ROOT = Path(starvewatch.__file__).resolve().parent


def module_files(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file of the package (a package's
    __init__.py is the package's own name)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join([package, *parts])] = path
    return modules


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return name in modules and modules[name].name == "__init__.py" or \
        any(other.startswith(name + ".") for other in modules)


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 > len(base) - 1:
        raise ValueError(f"{module}: relative import beyond the top-level package")
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imports_of(module: str, source: str, modules: dict[str, Path]) -> set[str]:
    """The package modules that `module` imports anywhere in its source."""
    is_package = modules.get(module, Path()).name == "__init__.py"
    edges: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                edges.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = (_resolve_relative(module, is_package, node.level, node.module) if node.level
                    else node.module)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                edges.add(submodule if submodule in modules else base)
    return {name for name in edges if name == PACKAGE or name.startswith(PACKAGE + ".")}


def import_graph(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    modules = modules if modules is not None else module_files()
    graph = {}
    for module, path in modules.items():
        targets = imports_of(module, path.read_text(), modules)
        unknown = {t for t in targets if t not in modules and not _is_package(t, modules)}
        assert not unknown, f"{module} imports modules that do not exist: {sorted(unknown)}"
        graph[module] = {t for t in targets if t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a
    sorted list: every circle of the graph lies within one of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _in(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


# ---- the rules -----------------------------------------------------------------------------

# The rooms (docs/design.md, "Rooms and imports") and the arrows allowed between them; any other
# arrow fails. "leaf": the shared top-level modules (schema, stats, quantities, ...), which import
# only each other. "entry": the public API and the command line, which compose the rooms.
ROOMS = ("hooks", "analysis", "monitor", "dashboard", "tuning", "integrations")
ENTRY_POINTS = {PACKAGE, f"{PACKAGE}.cli", f"{PACKAGE}.doctor", f"{PACKAGE}.demo", f"{PACKAGE}.__main__"}
ALLOWED = {
    "hooks": {"hooks", "analysis", "leaf"},
    "analysis": {"analysis", "leaf"},
    "monitor": {"monitor", "analysis", "leaf"},
    "dashboard": {"dashboard", "monitor", "analysis", "leaf"},
    "tuning": {"tuning", "hooks", "leaf"},
    "integrations": {"integrations", "hooks", "entry", "leaf"},
    "leaf": {"leaf"},
    "entry": {"entry", *ROOMS, "leaf"},
}
# third-party packages the pure analysis must never import (it runs inside the training process)
NOT_IN_ANALYSIS = {"fastapi", "starlette", "dash", "sqlite3", "uvicorn", "plotly"}


def room_of(module: str) -> str:
    if module in ENTRY_POINTS or _in(module, f"{PACKAGE}.cli"):  # the command line's package, whole
        return "entry"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else "leaf"


def test_every_arrow_between_rooms_is_an_allowed_one():
    graph = import_graph()
    wrong = sorted(f"{source} -> {target}" for source, targets in graph.items() for target in targets
                   if room_of(target) not in ALLOWED[room_of(source)])
    assert wrong == []
    # and the rooms exist as the rules name them (a rename would make every rule vacuous)
    assert {room_of(m) for m in graph} == {*ROOMS, "leaf", "entry"}


def test_the_training_process_imports_the_analysis_never_the_collector():
    graph = import_graph()
    hooks_out = {t for m, ts in graph.items() if _in(m, "starvewatch.hooks") for t in ts}
    assert any(_in(t, "starvewatch.analysis") for t in hooks_out)  # finish() summarises in-process
    assert not any(_in(t, "starvewatch.monitor") or _in(t, "starvewatch.dashboard") for t in hooks_out)


def third_party_imports(source: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_analysis_holds_no_web_framework_and_no_sql():
    analysis = {m: p for m, p in module_files().items() if _in(m, "starvewatch.analysis")}
    assert "starvewatch.analysis.summary" in analysis and "starvewatch.analysis.diagnosis" in analysis
    found = sorted(f"{m}: {name}" for m, path in analysis.items()
                   for name in third_party_imports(path.read_text()) & NOT_IN_ANALYSIS)
    assert found == []
    # the check itself sees a deferred import
    assert third_party_imports("def f():\n    import sqlite3\n    from dash import html\n") == {"sqlite3", "dash"}


def test_no_two_modules_share_a_name():
    stems = [path.stem for path in module_files().values() if path.name != "__init__.py"]
    assert sorted({s for s in stems if stems.count(s) > 1}) == []


def test_no_module_imports_itself_back_through_others():
    found = cycles(import_graph())
    assert found == [], "import circles (each group imports itself back):\n" + "\n".join(
        " <-> ".join(group) for group in found)


@pytest.mark.parametrize("room", ["starvewatch.monitor", "starvewatch.dashboard"])
def test_the_collector_side_never_imports_the_hooks(room):
    graph = import_graph()
    edges = sorted(f"{source} -> {target}" for source, targets in graph.items() if _in(source, room)
                   for target in targets if _in(target, "starvewatch.hooks") or target == PACKAGE)
    # (The package itself counts: starvewatch/__init__ imports the hooks.)
    assert edges == []


def test_the_collector_knows_no_ui():
    graph = import_graph()
    edges = sorted(f"{source} -> {target}" for source, targets in graph.items()
                   if _in(source, "starvewatch.monitor")
                   for target in targets if _in(target, "starvewatch.dashboard"))
    assert edges == []
    # ... and the dashboard is still composed onto it, by the entry point that serves it
    assert "starvewatch.dashboard" in graph["starvewatch.cli.collector_commands"]


def test_the_hot_path_imports_nothing_of_the_session_or_of_delivery():
    graph = import_graph()
    assert graph["starvewatch.hooks.loader"] <= {"starvewatch.hooks.introspect",
                                                "starvewatch.record_layout", "starvewatch.hooks.core"}
    assert "starvewatch.record_layout" in graph["starvewatch.hooks.loader"]
    assert graph["starvewatch.record_layout"] == set()
    # the choice of the compiled or the Python fast path (issue 29): a leaf (the optional
    # extension, starvewatch._ccore, is not a module of the source tree)
    assert graph["starvewatch.hooks.core"] == set()


# What delivery may take from the rest of hooks/: leaves that import nothing of the package
# (cuda's PENDING token, the stack dumper), and in the sidecar process alone the samplers'
# host and GPU readings. The step records' layout is a shared contract outside hooks/.
DELIVERY_MAY_IMPORT = {
    "starvewatch.hooks.cuda": None,  # None: any delivery module
    "starvewatch.hooks.stacks": None,
    "starvewatch.hooks.samplers": {"starvewatch.hooks.delivery.sidecar"},
}


def test_delivery_reads_contracts_never_the_hooks_internals():
    graph = import_graph()
    delivery = {m for m in graph if _in(m, "starvewatch.hooks.delivery")}
    reached = sorted(f"{m} -> {t}" for m in delivery for t in graph[m]
                     if _in(t, "starvewatch.hooks") and not _in(t, "starvewatch.hooks.delivery")
                     and not (t in DELIVERY_MAY_IMPORT
                              and (DELIVERY_MAY_IMPORT[t] is None or m in DELIVERY_MAY_IMPORT[t])))
    assert reached == []
    for leaf, users in DELIVERY_MAY_IMPORT.items():
        if users is None:
            assert graph[leaf] == set(), f"{leaf} is no longer a leaf: {sorted(graph[leaf])}"
    readers = sorted(m for m in delivery if "starvewatch.record_layout" in graph[m])
    assert "starvewatch.hooks.delivery.records" in readers and "starvewatch.hooks.delivery.shipper" in readers


def test_delivery_is_wired_by_the_session_alone_and_never_reaches_back():
    graph = import_graph()
    delivery = {m for m in graph if _in(m, "starvewatch.hooks.delivery")}
    assert "starvewatch.hooks.delivery.shipper" in delivery
    into = sorted(f"{m} -> {t}" for m, targets in graph.items()
                  if _in(m, "starvewatch.hooks") and not _in(m, "starvewatch.hooks.delivery")
                  for t in targets if t in delivery)
    assert into and all(edge.startswith("starvewatch.hooks.session -> ") for edge in into), into
    back = sorted(f"{m} -> {t}" for m in delivery for t in graph[m]
                  if t in ("starvewatch.hooks.session", "starvewatch.hooks.loader", PACKAGE))
    assert back == []


# ---- the walker itself: it must see what the rules depend on ----------------------------------

def _graph_of(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    root = tmp_path / PACKAGE
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return import_graph(module_files(root))


def test_the_walker_sees_deferred_relative_and_submodule_imports(tmp_path):
    graph = _graph_of(tmp_path, {
        "__init__.py": "from .a.b import f\n__version__ = '1'\n",
        "a/__init__.py": "",
        "a/b.py": "def f():\n    from . import c  # deferred, a submodule\n    return c\n",
        "a/c.py": "from .. import __version__\nimport starvewatch.d\n",
        "d.py": "from starvewatch.a import c\nfrom starvewatch.a import b as renamed\n",
        "e.py": "class K:\n    def m(self):\n        if True:\n            from .a.b import f\n",
    })
    assert graph["starvewatch"] == {"starvewatch.a.b"}
    assert graph["starvewatch.a.b"] == {"starvewatch.a.c"}
    # `from .. import __version__`: a name, not a submodule, so the package's __init__
    assert graph["starvewatch.a.c"] == {"starvewatch", "starvewatch.d"}
    assert graph["starvewatch.d"] == {"starvewatch.a.c", "starvewatch.a.b"}
    assert graph["starvewatch.e"] == {"starvewatch.a.b"}
    assert cycles(graph) == [["starvewatch", "starvewatch.a.b", "starvewatch.a.c", "starvewatch.d"]]


def test_the_walker_finds_a_two_module_circle_and_none_in_a_chain(tmp_path):
    circle = _graph_of(tmp_path / "one", {"__init__.py": "", "x.py": "from . import y\n",
                                          "y.py": "def g():\n    from .x import h\n"})
    assert cycles(circle) == [["starvewatch.x", "starvewatch.y"]]
    chain = _graph_of(tmp_path / "two", {"__init__.py": "", "x.py": "from . import y\n",
                                         "y.py": "import os\n"})
    assert cycles(chain) == []


def test_the_walker_rejects_an_import_of_a_module_that_does_not_exist(tmp_path):
    with pytest.raises(AssertionError, match="starvewatch.nope"):
        _graph_of(tmp_path, {"__init__.py": "", "x.py": "from .nope import z\n"})
