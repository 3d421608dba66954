"""The shape of plpython/ (issue #26, "Layout"), from the sources' AST, without a server:
the import graph of the shipped modules has no circle, every import resolves to a shipped
file, the backend code imports nothing of sabre_pg but ``sabre_pg.core``, and the installer
ships exactly the files of plpython/ (docs/architecture.md)."""
from __future__ import annotations

import ast
from pathlib import Path

from sabre_pg import installer

REPO = Path(__file__).resolve().parents[2]
PLPYTHON = REPO / "plpython"
SYNTHESIZED = {"_installed"}          # written by the installer, not a file (installer.INSTALLED_MODULE)


def modules() -> dict[str, Path]:
    """Every module of plpython/ by its name below ``sabre_plpy`` (``folder.module``)."""
    return {".".join(p.relative_to(PLPYTHON).with_suffix("").parts): p
            for p in sorted(PLPYTHON.rglob("*.py")) if "__pycache__" not in p.parts}


def imported(name: str, source: str, known: dict) -> tuple[set[str], set[str], set[str]]:
    """(plpython modules, unresolved plpython names, other absolute modules) that module
    ``name`` (of source ``source``) imports anywhere, function-local imports included."""
    package = name.split(".")[:-1]
    found, unresolved, other = set(), set(), set()

    def add(target: list[str], names):
        dotted = ".".join(target)
        if dotted in known or dotted in SYNTHESIZED:
            found.add(dotted)
        elif names and (not target or any(k.startswith(dotted + ".") for k in known)):
            for n in names:                 # `from <package> import module`
                sub = ".".join([*target, n])
                (found if sub in known or sub in SYNTHESIZED else unresolved).add(sub)
        else:
            unresolved.add(dotted)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            add(base + (node.module.split(".") if node.module else []), [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sabre_plpy":
            add(node.module.split(".")[1:], [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom):
            other.add(node.module)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "sabre_plpy":
                    add(a.name.split(".")[1:], [])
                else:
                    other.add(a.name)
    return found - SYNTHESIZED, unresolved, other


def imports() -> dict[str, tuple[set[str], set[str], set[str]]]:
    """``imported`` of every module of plpython/."""
    known = modules()
    return {name: imported(name, path.read_text(encoding="utf-8"), known) for name, path in known.items()}


def graph() -> dict[str, set[str]]:
    return {name: found for name, (found, _, _) in imports().items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_imports_of_every_form():
    """The graph builder itself: relative (any depth, function-local) and absolute imports."""
    known = {"a.x": None, "a.y": None, "b.z": None}
    src = ("from . import x\nfrom ..b import z as Z\ndef f():\n    from .y import g\n    from . import gone\n"
           "import sabre_pg.core.emd\nfrom sabre_plpy.b.z import h\nfrom .._installed import SCHEMA\n")
    assert imported("a.m", src, known) == ({"a.x", "a.y", "b.z"}, {"a.gone"}, {"sabre_pg.core.emd"})
    assert imported("m", "from . import common as C\nfrom .errors import E\n", {"common": 0, "errors": 0}) \
        == ({"common", "errors"}, set(), set())
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_no_import_circles():
    assert cycles(graph()) == []


def test_every_import_resolves_to_a_shipped_module():
    assert {name: sorted(unresolved) for name, (_, unresolved, _) in imports().items() if unresolved} == {}


def test_backend_code_imports_only_the_core_of_sabre_pg():
    """plpython/ runs in the server: of sabre_pg it may import only sabre_pg.core (shipped)."""
    wrong = {name: sorted(m for m in other if m.split(".")[0] == "sabre_pg" and m.split(".")[:2] != ["sabre_pg", "core"])
             for name, (_, _, other) in imports().items()}
    assert {k: v for k, v in wrong.items() if v} == {}


def test_the_installer_ships_exactly_the_files_of_plpython():
    shipped = {name: (src, pkg) for name, src, pkg in installer.collect_modules("sabre")
               if name.split(".")[0] == "sabre_plpy"}
    files = {"sabre_plpy." + name: (path.read_text(encoding="utf-8"), False) for name, path in modules().items()}
    folders = {"sabre_plpy", *("sabre_plpy." + ".".join(name.split(".")[:i])
                               for name in modules() for i in range(1, name.count(".") + 1))}
    assert set(shipped) == set(files) | folders | {installer.INSTALLED_MODULE}
    assert {name: shipped[name] for name in files} == files
    assert all(shipped[f] == ("", True) for f in folders)


# ---------------------------------------------------------------------------------------
# folders by entry point (tools/regroup_plpython.py made them; docs/architecture.md)
# ---------------------------------------------------------------------------------------
# folder -> layer: an import goes to a lower layer or stays in its folder, never to another
# folder of its own layer (entry points of one kind never import another kind's)
LAYERS = {"batch": 3, "stream": 3, "preflight": 3, "catalog": 3, "stages": 2, "shared": 1}


def test_every_module_lives_in_a_folder_of_the_layout():
    assert [name for name in modules() if name.count(".") != 1 or name.split(".")[0] not in LAYERS] == []


def test_imports_go_one_way():
    """entry points -> stages -> shared helpers -> sabre_pg.core: a helper never imports a stage
    or an entry point, a stage never an entry point, an entry point never another folder's."""
    def folder(name):
        return name.split(".")[0]

    wrong = sorted(f"{a} imports {b}" for a, targets in graph().items() for b in targets
                   if folder(a) != folder(b) and LAYERS.get(folder(a), 0) <= LAYERS.get(folder(b), 0))
    assert wrong == []


def test_the_sql_wrappers_import_entry_points_only():
    """Every `from sabre_plpy.<folder> import <module>` of sql/*.sql names a module of an
    entry-point folder that exists."""
    found = {}
    for path in sorted((REPO / "sql").glob("*.sql")):
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
        imports = "\n".join(line for line in lines if line.startswith(("from sabre_plpy", "import sabre_plpy")))
        for node in ast.walk(ast.parse(imports)):
            if isinstance(node, ast.ImportFrom):
                found.update({".".join([*node.module.split(".")[1:], a.name]): path.name for a in node.names})
            elif isinstance(node, ast.Import):
                found.update({".".join(a.name.split(".")[1:]): path.name for a in node.names})
    assert found and {m: f for m, f in found.items()
                      if m not in modules() or LAYERS.get(m.split(".")[0]) != max(LAYERS.values())} == {}
