"""Every PL/Python entry point is reached through its PL/pgSQL wrapper (issue 29: errors read
like PostgreSQL's): in the rendered SQL, each public plpython3u function is a ``<name>_impl``
with a wrapper ``<name>`` whose exception clause is ``installer.ERRORS``."""
from __future__ import annotations

import re

import pytest

from sabre_pg import installer

INTERNAL = {"sabre_selftest", "stream_migrate", "sabre_citus_shard",    # no user calls these (the last: a Citus run
            "sabre_driven_step", "sabre_driven_failed", "sabre_driven_result",  # calls it on the workers; the driven
            "sabre_driven_result_multi"}                                   # run's protocol: its wrappers call them)


def rendered() -> str:
    return "\n".join(installer.render_sql(f.read_text(), "sabre") for f in installer.sql_files())


def test_every_plpython_entry_point_has_a_reporting_wrapper():
    text = rendered()
    plpython = re.findall(r'CREATE OR REPLACE FUNCTION "sabre"\.(\w+)\((?:(?!\$fn\$).)*?LANGUAGE plpython3u', text, re.S)
    public = [name for name in plpython if not name.endswith("_impl") and name not in INTERNAL]
    assert public == []
    for impl in {name for name in plpython if name.endswith("_impl")}:
        name = impl[:-len("_impl")]
        wrappers = re.findall(r'CREATE OR REPLACE FUNCTION "sabre"\.%s\((?:(?!\$fn\$).)*?LANGUAGE plpgsql'
                              r'(?:(?!\$fn\$).)*\$fn\$((?:(?!\$fn\$).)*)\$fn\$' % name, text, re.S)
        assert wrappers, name
        driven = installer.render_sql(installer.ERRORS_DRIVEN, "sabre").strip()    # (it names sabre's schema)
        assert all(installer.ERRORS.strip() in body or driven in body for body in wrappers), name


def test_wrapper_of_a_typed_result_drops_the_table_form():
    text = 'CREATE OR REPLACE FUNCTION @schema@.f_impl(\n    a text, output text DEFAULT NULL)\n' \
           'RETURNS TABLE (output regclass, n bigint)\nLANGUAGE plpython3u VOLATILE SET search_path = ' \
           'pg_catalog, pg_temp AS $fn$\nreturn []\n$fn$;\n@wrap:f:f_result@\n'
    out = installer.render_sql(text, "s")
    assert "DROP FUNCTION \"s\".f(text, text);" in out and "RETURNS SETOF \"s\".f_result" in out
    assert "RETURN QUERY SELECT * FROM \"s\".f_impl($1, $2);" in out and "output text DEFAULT NULL" in out
    with pytest.raises(installer.InstallError):
        installer.render_sql("@wrap:nothing@\n", "s")
