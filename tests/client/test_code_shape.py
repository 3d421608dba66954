"""Shape rules of issue #14 that a reviewer would otherwise check by hand."""
from __future__ import annotations

import ast
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
    paths = sorted((REPO / "plpython").glob("*.py")) + sorted((REPO / "sabre_pg").rglob("*.py"))
    long = ["%s:%d %s (%d lines)" % (path, node.lineno, node.name, node.end_lineno - node.lineno + 1)
            for path, node in _functions(paths)
            if node.end_lineno - node.lineno + 1 > LIMIT and "long:" not in (ast.get_docstring(node) or "")]
    assert long == []


def test_entry_points_report_stage_errors():
    """Every function the SQL wrappers call runs inside errors.entry_point, so a SabreError
    raised by a stage always reaches the caller as SQLSTATE + message + HINT."""
    called = {("anonymize", "run"), ("verify", "run"), ("hierarchies", "define"), ("hierarchies", "drop"),
              ("utility", "utility"), ("utility", "query_error"), ("utility", "kl_divergence"),
              ("estimate", "estimate"), ("instant", "instant")}
    for module, name in called:
        tree = ast.parse((REPO / "plpython" / (module + ".py")).read_text(encoding="utf-8"))
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
        assert any(ast.unparse(d) == "E.entry_point" for d in fn.decorator_list), (module, name)
