"""plpython/ in folders, as installed (issue #26, "Layout"): each folder is a package of
``sabre_plpy`` in ``<schema>.modules``, every module imports in the backend (relative imports
across folders resolve through the installer's loader), and ``check`` reports a tampered
module of any folder, or a missing folder."""
from __future__ import annotations

from sabre_pg import installer
from tests.client.test_layout import LAYERS, modules


def _plpy_rows(conn) -> dict[str, bool]:
    return dict(conn.execute("SELECT name, is_package FROM sabre.modules WHERE name LIKE 'sabre_plpy.%'").fetchall())


def test_every_folder_is_a_package_and_every_module_imports_in_the_backend(pg_conn):
    rows = _plpy_rows(pg_conn)
    assert {f"sabre_plpy.{f}": True for f in LAYERS}.items() <= rows.items()
    assert {f"sabre_plpy.{m}": False for m in modules()}.items() <= rows.items()
    pg_conn.execute("SELECT sabre.sabre_selftest()")        # the bootstrap: the loader is in place
    names = sorted(f"sabre_plpy.{m}" for m in modules())
    pg_conn.execute("DO $$\nimport importlib\nfor m in %r:\n    importlib.import_module(m)\n$$ LANGUAGE plpython3u"
                    % (names,))


def test_check_reports_a_tampered_module_in_each_folder_and_a_missing_folder(pg_conn):
    first = {}
    for m in sorted(modules()):
        first.setdefault(m.split(".")[0], m)
    before = set(installer.tampering(pg_conn, "sabre"))
    for m in first.values():
        pg_conn.execute("UPDATE sabre.modules SET source = source || E'\\nimport os' WHERE name = %s",
                        (f"sabre_plpy.{m}",))
    pg_conn.execute("DELETE FROM sabre.modules WHERE name = 'sabre_plpy.stages'")
    found = set(installer.tampering(pg_conn, "sabre")) - before
    assert len(first) == len(LAYERS)
    assert {f for f in found if f.startswith("module")} == {
        *(f"module sabre_plpy.{m}: source differs from the package's" for m in first.values()),
        "module sabre_plpy.stages is missing"}
