#!/usr/bin/env python3
"""Regroup plpython/ into folders by entry point (issue #26, "Layout"); run once, on the final tree.

    python3 tools/regroup_plpython.py --check     # what would move; refuses an unmapped module
    python3 tools/regroup_plpython.py             # git mv + rewrites, staged (not committed)
    python3 tools/regroup_plpython.py --commit    # the same, then one commit

Every ``plpython/<name>.py`` moves with ``git mv`` to ``plpython/<folder>/<name>.py`` (``MAPPING``;
files keep their names), and every reference follows it:

* relative imports inside the moved modules (``from . import x``, ``from .x import y``, at any
  indentation), recomputed from the module's new folder, split by folder when one statement
  names modules of several folders (``from .._installed import SCHEMA`` for the installer's
  synthesized module);
* in every tracked text file: ``from sabre_plpy import m`` (the SQL wrappers), ``sabre_plpy.m``,
  the test helper's ``sabre_plpy("m")``, the paths ``plpython/m.py``, ``sabre_plpy/m.py`` and
  ``"plpython" / "m.py"``, and ``plpython/*.py`` (now ``plpython/**/*.py``);
* docs/architecture.md: the section between ``DOC_BEGIN`` and ``DOC_END`` (inserted before the
  stages' section when absent) is written from ``FOLDERS``, ``MAPPING`` and the SQL wrappers.

The new tree is checked in memory before anything is written (every relative import resolves,
imports go one way: entry points -> stages -> shared helpers -> sabre_pg.core, no circle).
It refuses, changing nothing: a plpython/*.py it has no mapping for (add it to ``MAPPING``), a
tree that is already regrouped, uncommitted changes (unless ``--allow-dirty``), or a new tree
that fails the check.  tests/client/test_layout.py asserts the same rules afterwards.
"""
from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

# folder -> (rank, what it holds).  Imports go from a higher rank to a lower one, or within
# one folder; never between two folders of the same rank.
FOLDERS = {
    "batch": (3, "`sabre_anonymize` (its partitioned form too), `sabre_verify`, the utility measures"),
    "stream": (3, "streams (SABRE_W) and pg_cron jobs: stream advances, refreshes of batch outputs"),
    "preflight": (3, "predictions before a run: `sabre_estimate`, `sabre_instant` (and its expression statistics)"),
    "catalog": (3, "hierarchies in the sabre catalog"),
    "stages": (2, "what every run shares: request, scan, publish"),
    "shared": (1, "errors, the schema and options, bulk transfer, exact closeness, progress, interrupts, "
                  "label views, pg_cron, Citus tables, type checks"),
}

# module -> folder.  A new plpython/*.py must be added here (the script refuses it otherwise).
MAPPING = {
    "anonymize": "batch", "partition": "batch", "verify": "batch", "utility": "batch",
    "stream": "stream", "schedule": "stream",
    "estimate": "preflight", "instant": "preflight", "expression_statistics": "preflight",
    "hierarchies": "catalog",
    "request": "stages", "scan": "stages", "publish": "stages",
    "errors": "shared", "common": "shared", "safe_types": "shared", "transfer": "shared",
    "closeness": "shared", "progress": "shared", "interrupts": "shared", "labels": "shared",
    "cron": "shared", "citus": "shared",
}

SELF = Path("tools/regroup_plpython.py")
# files left as they are: this script and its test (whose small trees spell the flat layout)
UNTOUCHED = {SELF, Path("tests/client/test_regroup_plpython.py")}
TEXT_SUFFIXES = {".py", ".sql", ".md", ".toml", ".in", ".txt", ".sh", ".cfg", ".ini", ".yml", ".yaml", ".rst"}
DOC = Path("docs/architecture.md")
DOC_BEGIN = "<!-- plpython layout: written by tools/regroup_plpython.py -->"
DOC_END = "<!-- end of plpython layout -->"
DOC_BEFORE = "## `sabre_anonymize` in four stages"


class Refused(Exception):
    pass


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


# ------------------------------------------------------------------------------ relative imports
def spec(old_folder: str, target_folder: str | None) -> str:
    """The relative package, seen from a module of ``old_folder``, of ``target_folder``
    (None: the root package ``sabre_plpy``)."""
    if target_folder == old_folder:
        return "."
    return ".." + (target_folder or "")


def folder_of(name: str) -> str | None:
    """The folder of a top-level name imported relatively (None: stays at the root, e.g. the
    installer's synthesized ``_installed``)."""
    return MAPPING.get(name)


def rewrite_relative_imports(source: str, module: str) -> str:
    """``source`` of ``plpython/<module>.py`` with its relative imports as seen from its folder."""
    folder = MAPPING[module]
    lines = source.splitlines(keepends=True)
    edits = []                                   # (first line, last line, replacement lines)
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        if node.level != 1:
            raise Refused(f"plpython/{module}.py:{node.lineno}: a relative import above plpython/")
        first = lines[node.lineno - 1]
        head = re.compile(r"from\s+\.(?![.\w])\s*import\b" if node.module is None
                          else r"from\s+\." + re.escape(node.module) + r"\b")
        match = head.match(first, node.col_offset)
        if not match:
            raise Refused(f"plpython/{module}.py:{node.lineno}: cannot parse this import's first line")
        if node.module is not None:             # from .x import y: x's package, then x
            target = folder_of(node.module.split(".")[0])
            package = spec(folder, target)
            new = "from " + package + ("." if target and package != "." else "") + node.module
            edits.append((node.lineno, node.lineno, [first[:match.start()] + new + first[match.end():]]))
            continue
        groups: dict[str, list[str]] = {}
        for alias in node.names:
            text = alias.name + (f" as {alias.asname}" if alias.asname else "")
            groups.setdefault(spec(folder, folder_of(alias.name)), []).append(text)
        if len(groups) == 1:
            (target,) = groups
            edits.append((node.lineno, node.lineno,
                          [first[:match.start()] + f"from {target} import" + first[match.end():]]))
            continue
        indent = " " * node.col_offset
        comment = ""
        if node.lineno == node.end_lineno and "#" in first[node.end_col_offset:]:
            comment = "  " + first[node.end_col_offset:].strip()
        new_lines = [f"{indent}from {target} import {', '.join(names)}" for target, names in groups.items()]
        new_lines[0] += comment
        edits.append((node.lineno, node.end_lineno, [line + "\n" for line in new_lines]))
    for start, end, new in sorted(edits, reverse=True):
        lines[start - 1:end] = new
    return sort_import_blocks("".join(lines))


def sort_import_blocks(source: str) -> str:
    """Top-level runs of one-line relative imports sorted: other folders (``..``) first, then
    this folder, each by module."""
    lines = source.splitlines(keepends=True)
    runs, run = [], []
    for node in ast.parse(source).body:
        one_line = isinstance(node, ast.ImportFrom) and node.level and node.lineno == node.end_lineno
        if one_line and run and run[-1] == node.lineno - 1:
            run.append(node.lineno)
        else:
            if len(run) > 1:
                runs.append(run)
            run = [node.lineno] if one_line else []
    if len(run) > 1:
        runs.append(run)
    for run in runs:
        block = [lines[i - 1] for i in run]
        lines[run[0] - 1:run[-1]] = sorted(block, key=lambda s: (not s.lstrip().startswith("from .."), s))
    return "".join(lines)


# ------------------------------------------------------------------------------ other references
def _names_by_folder(names: str) -> dict[str | None, list[str]]:
    groups: dict[str | None, list[str]] = {}
    for item in (n.strip() for n in names.split(",") if n.strip()):
        groups.setdefault(MAPPING.get(item.split()[0]), []).append(item)
    return groups


def _from_sabre_plpy(m: re.Match) -> str:
    groups = _names_by_folder(m["names"])
    out = [f"{m['indent']}from sabre_plpy{'.' + folder if folder else ''} import {', '.join(names)}"
           for folder, names in groups.items()]
    out[0] += m["tail"]
    return "\n".join(out)


REFERENCE = re.compile("|".join((
    r"(?P<from>^(?P<indent>[ \t]*)from[ \t]+sabre_plpy[ \t]+import[ \t]+(?P<names>\w+(?:[ \t]+as[ \t]+\w+)?"
    r"(?:[ \t]*,[ \t]*\w+(?:[ \t]+as[ \t]+\w+)?)*)(?P<tail>[ \t]*(?:#[^\n]*)?)$)",
    r"(?P<inline>\bfrom sabre_plpy import (?P<inline_name>\w+)\b(?![ \t]*,))",
    r"(?P<dotted>\bsabre_plpy\.(?P<dotted_name>\w+)\b)",
    r"(?P<call>\bsabre_plpy\(\s*(?P<q>[\"'])(?P<call_name>\w+)(?P=q)\s*\))",
    r"(?P<path>(?<!\w)(?P<path_root>plpython|sabre_plpy)/(?P<path_name>\w+)\.py\b)",
    r"(?P<joined>\"plpython\"\s*/\s*\"(?P<joined_name>\w+)\.py\")",
    r"(?P<glob>(?<!\w)plpython/\*\.py\b)",
)), re.M)


def _reference(m: re.Match) -> str:
    if m["from"]:
        return _from_sabre_plpy(m)
    for kind in ("inline", "dotted", "call", "path", "joined"):
        if m[kind]:
            name = m[kind + "_name"]
            if name not in MAPPING:
                return m[0]
            folder = MAPPING[name]
            return {"inline": f"from sabre_plpy.{folder} import {name}",
                    "dotted": f"sabre_plpy.{folder}.{name}",
                    "call": f'sabre_plpy({m["q"]}{folder}.{name}{m["q"]})',
                    "path": f"{m['path_root']}/{folder}/{name}.py",
                    "joined": f'"plpython" / "{folder}" / "{name}.py"'}[kind]
    return "plpython/**/*.py"


def rewrite_references(text: str) -> str:
    return REFERENCE.sub(_reference, text)


# ------------------------------------------------------------------------------ docs/architecture.md
def entry_points(sql_texts: dict[str, str]) -> dict[str, list[str]]:
    """module -> the SQL functions whose wrapper imports it (from the rewritten sql/*.sql)."""
    out: dict[str, list[str]] = {}
    for text in sql_texts.values():
        for fn in re.split(r"(?=CREATE OR REPLACE FUNCTION )", text):
            name = re.match(r"CREATE OR REPLACE FUNCTION @schema@\.(\w+)\(", fn)
            if not name:
                continue
            for _, modules in re.findall(r"^\s*from sabre_plpy\.(\w+) import ([\w, ]+)$", fn, re.M):
                for module in (m.strip() for m in modules.split(",")):
                    if name[1] not in out.setdefault(module, []):
                        out[module].append(name[1])
    return out


def layout_section(present: list[str], sql_texts: dict[str, str]) -> str:
    called = entry_points(sql_texts)
    rows = []
    for folder, (rank, what) in sorted(FOLDERS.items(), key=lambda f: (-f[1][0], f[0])):
        mods = sorted(m for m in present if MAPPING[m] == folder)
        cells = ", ".join(f"`{m}.py`" + (" (" + ", ".join(f"`{f}`" for f in called[m]) + ")" if m in called else "")
                          for m in mods)
        rows.append(f"| `plpython/{folder}/` | {'entry points' if rank == 3 else 'stages' if rank == 2 else 'helpers'}"
                    f" | {what} | {cells} |")
    return "\n".join([
        DOC_BEGIN,
        "## `plpython/` by entry point",
        "",
        "Each folder is one kind of entry point, the stages they share, or the helpers under both; a",
        "module's SQL functions are the wrappers in `sql/*.sql` that import it",
        "(`from sabre_plpy.<folder> import <module>`; the installer ships `plpython/<folder>/<module>.py`",
        "as `sabre_plpy.<folder>.<module>`, each folder a package, and `check` compares every one).",
        "",
        "| folder | layer | holds | modules (SQL functions) |",
        "|---|---|---|---|",
        *rows,
        "",
        "**Imports go one way:** entry points (`batch/`, `stream/`, `preflight/`, `catalog/`) → `stages/`",
        "→ `shared/` → `sabre_pg.core`. A module imports from a lower layer or from its own folder,",
        "never from another folder of its layer (an entry point never imports another kind's), and no",
        "import circle exists; a stage or helper that needs an entry point's code takes it as a callable",
        "(`partition.run(..., run_part)`). `tests/client/test_layout.py` asserts these rules from the",
        "sources' AST. A new module goes beside its importer when one kind of entry point uses it;",
        "used by several kinds, it goes into `stages/` (a stage of a run) or `shared/` (a helper, which",
        "imports only helpers and the core).",
        DOC_END,
        "",
    ])


def rewrite_doc(text: str, section: str) -> str:
    if DOC_BEGIN in text and DOC_END in text:
        head, rest = text.split(DOC_BEGIN, 1)
        return head + section.rstrip("\n") + rest.split(DOC_END, 1)[1]
    if DOC_BEFORE in text:
        return text.replace(DOC_BEFORE, section + "\n" + DOC_BEFORE, 1)
    return text.rstrip("\n") + "\n\n" + section


# ------------------------------------------------------------------------------ the check
def check_tree(modules: dict[str, str]) -> list[str]:
    """Problems of the new tree: ``modules`` maps ``folder.name`` to its source."""
    problems, edges = [], {}
    for name, source in modules.items():
        folder = name.split(".")[0]
        edges[name] = set()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = [] if node.level == 2 else [folder]
            targets = [".".join(base + [a.name]) for a in node.names]
            if node.module:                     # a module, or a folder to import modules from
                module = ".".join(base + node.module.split("."))
                targets = [module] if module in modules or module == "_installed" else \
                    [f"{module}.{a.name}" for a in node.names]
            for target in targets:
                if target == "_installed":
                    continue
                if target not in modules:
                    problems.append(f"{name}: imports {target}, which is not a module")
                    continue
                edges[name].add(target)
                if target.split(".")[0] != folder and FOLDERS[target.split(".")[0]][0] >= FOLDERS[folder][0]:
                    problems.append(f"{name}: imports {target} (not a lower layer)")
    seen, done = set(), set()

    def visit(v, path):
        if v in done:
            return
        if v in seen:
            problems.append("import circle: " + " -> ".join(path[path.index(v):] + [v]))
            return
        seen.add(v)
        for w in sorted(edges.get(v, ())):
            visit(w, path + [v])
        done.add(v)

    for v in sorted(edges):
        visit(v, [])
    return problems


# ------------------------------------------------------------------------------ main
def neighbours(plp: Path, names: list[str]) -> list[str]:
    """For each unmapped module of the flat tree: the modules it imports and those importing
    it, with their folders (its folder must be at or above the first, below the second)."""
    flat = {p.stem: p for p in plp.glob("*.py")}
    edges = {}
    for name, path in flat.items():
        edges[name] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                edges[name].update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])

    def shown(modules):
        return ", ".join(f"{m} ({MAPPING.get(m, '?')})" for m in sorted(modules & set(flat))) or "none"
    return [f"plpython/{n}.py imports {shown(edges[n])}; imported by {shown({m for m in flat if n in edges[m]})}"
            for n in names]


def plan(root: Path, allow_dirty: bool, check_only: bool = False) -> tuple[list[tuple[str, str]], dict[str, str], list[str]]:
    """(moves, new contents by path, notes) or Refused."""
    plp = root / "plpython"
    nested = sorted(str(p.relative_to(root)) for p in plp.glob("*/**/*.py") if "__pycache__" not in p.parts)
    if nested or any((plp / f).is_dir() for f in FOLDERS):
        raise Refused("plpython/ is already regrouped (or has subfolders): " + ", ".join(nested or FOLDERS))
    flat = sorted(p.stem for p in plp.glob("*.py"))
    unmapped = [n for n in flat if n not in MAPPING]
    if unmapped:
        raise Refused("no folder for: " + ", ".join(f"plpython/{n}.py" for n in unmapped)
                      + " -- add each to MAPPING in " + str(SELF) + "\n  " + "\n  ".join(neighbours(plp, unmapped)))
    if not (allow_dirty or check_only) and git(root, "status", "--porcelain", "--untracked-files=no").strip():
        raise Refused("the work tree has uncommitted changes (commit them, or pass --allow-dirty)")
    notes = [f"MAPPING names plpython/{n}.py, which this tree does not have" for n in MAPPING if n not in flat]
    moves = [(f"plpython/{n}.py", f"plpython/{MAPPING[n]}/{n}.py") for n in flat]
    moved = dict(moves)
    contents = {}
    for rel in git(root, "ls-files").splitlines():
        path = root / rel
        if Path(rel) in UNTOUCHED or not path.is_file() or (path.suffix not in TEXT_SUFFIXES and path.name != "Dockerfile"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = text
        if rel in moved:
            new = rewrite_relative_imports(new, Path(rel).stem)
        new = rewrite_references(new)
        if new != text or rel in moved:
            contents[moved.get(rel, rel)] = new
    sql_texts = {p: t for p, t in contents.items() if p.startswith("sql/")}
    sql_texts.update({str(p.relative_to(root)): p.read_text(encoding="utf-8") for p in (root / "sql").glob("*.sql")
                      if str(p.relative_to(root)) not in sql_texts})
    doc = contents.get(str(DOC), (root / DOC).read_text(encoding="utf-8") if (root / DOC).exists() else "# Architecture\n")
    contents[str(DOC)] = rewrite_doc(doc, layout_section(flat, sql_texts))
    problems = check_tree({f"{MAPPING[n]}.{n}": contents[f"plpython/{MAPPING[n]}/{n}.py"] for n in flat})
    if problems:
        raise Refused("the regrouped tree would break these rules:\n  " + "\n  ".join(problems))
    return moves, contents, notes


def apply(root: Path, moves, contents) -> None:
    for old, new in moves:
        (root / new).parent.mkdir(parents=True, exist_ok=True)
        git(root, "mv", old, new)
    for rel, text in contents.items():
        (root / rel).write_text(text, encoding="utf-8")
    git(root, "add", "--", *contents)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=None, help="the checkout (default: this script's)")
    ap.add_argument("--check", action="store_true", help="say what would move; change nothing")
    ap.add_argument("--commit", action="store_true", help="commit the regroup")
    ap.add_argument("--allow-dirty", action="store_true", help="run with uncommitted changes")
    args = ap.parse_args(argv)
    root = Path(git(args.repo or Path(__file__).resolve().parent, "rev-parse", "--show-toplevel").strip())
    try:
        moves, contents, notes = plan(root, args.allow_dirty, args.check)
    except Refused as e:
        print(f"regroup_plpython: refused: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}")
    for old, new in moves:
        print(f"{old} -> {new}")
    edited = sorted(set(contents) - {new for _, new in moves})
    print(f"{len(moves)} modules move; {len(edited)} other files change: {', '.join(edited)}")
    if args.check:
        return 0
    apply(root, moves, contents)
    if args.commit:
        git(root, "commit", "-q", "-m", "plpython/: regroup by entry point (tools/regroup_plpython.py)\n\n"
            "Applied by the script, no hand edits: git mv of every module into batch/, stream/, preflight/,\n"
            "catalog/, stages/ or shared/; relative imports recomputed; the SQL wrappers, tests, benchmarks\n"
            "and docs follow the new paths; docs/architecture.md's layout section regenerated.")
        print("committed")
    else:
        print("staged; review with git diff --cached -M, then commit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
