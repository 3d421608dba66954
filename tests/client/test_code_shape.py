"""Shape rules of issue #14 that a reviewer would otherwise check by hand."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMIT = 80


def _functions(paths):
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(REPO), node


def test_no_function_longer_than_80_lines_without_saying_why():
    paths = sorted((REPO / "plpython").rglob("*.py")) + sorted((REPO / "sabre_pg").rglob("*.py"))
    long = ["%s:%d %s (%d lines)" % (path, node.lineno, node.name, node.end_lineno - node.lineno + 1)
            for path, node in _functions(paths)
            if node.end_lineno - node.lineno + 1 > LIMIT and "long:" not in (ast.get_docstring(node) or "")]
    assert long == []


def _wrapper_calls():
    """(module, function) of every sabre_plpy call in the SQL wrappers: `return m.f(plpy, ...)`."""
    calls = set()
    for path in sorted((REPO / "sql").glob("*.sql")):
        calls.update(re.findall(r"\breturn\s+([a-z_]+)\.([a-z_]+)\(plpy\b", path.read_text(encoding="utf-8")))
    return calls


def _wrapper_modules():
    """The file of each module the SQL wrappers import: `from sabre_plpy[.folder] import m`."""
    found = {}
    for path in sorted((REPO / "sql").glob("*.sql")):
        for package, names in re.findall(r"^\s*from sabre_plpy((?:\.\w+)*) import ([\w, ]+)$",
                                         path.read_text(encoding="utf-8"), re.M):
            for name in names.replace(" ", "").split(","):
                found[name] = REPO.joinpath("plpython", *package.split(".")[1:], name + ".py")
    return found


def test_entry_points_report_stage_errors():
    """Every function the SQL wrappers call runs inside errors.entry_point, so a SabreError
    raised by a stage always reaches the caller as SQLSTATE + message + HINT."""
    called, files = _wrapper_calls(), _wrapper_modules()
    assert {("anonymize", "run"), ("verify", "run"), ("estimate", "estimate"), ("instant", "instant")} <= called
    # the driven-run protocol (plpython/shared/driven.py) is not an entry point: it hands the
    # entry point's job its statements; the job sets up its own progress, pages and interrupt contexts
    # (an entry point's progress observer installed around a step would take the job's phases)
    assert {("driven", "step"), ("driven", "failed")} <= called
    for module, name in called - {("driven", "step"), ("driven", "failed"), ("driven", "result")}:
        tree = ast.parse(files[module].read_text(encoding="utf-8"))
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
        assert any(ast.unparse(d) == "E.entry_point" for d in fn.decorator_list), (module, name)
