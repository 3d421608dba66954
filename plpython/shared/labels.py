"""The label view ``<output>_labels`` (options.labels): the output as BI tools chart it.

One row per output row: ``ec_id``; each numerical quasi-identifier as one text column named
after it, ``[lo, hi]`` or the single value when lo = hi (each end printed by its type's
output function, as ``format('%s')`` does); each categorical one unchanged; the sensitive
attribute and the ``keep`` columns unchanged.  Plain column types (bigint, text, the SA's
own), so Metabase, Superset or Tableau read it directly (docs/bi-views.md).

The view is built by publish's swap on the new output under a temporary name and then
handled like the other relations of the run: renamed into place, its COMMENT carries the
run's identity, it is recorded, a rerun replaces it, ``uninstall --purge`` drops it.
"""
from __future__ import annotations

from . import common as C

SUFFIX = "_labels"
TAG = "l"        # the temporary name's tag


def label_sql(lo: str, hi: str) -> str:
    """A text label of the range ``lo``..``hi`` (SQL expressions)."""
    return ("CASE WHEN %s OPERATOR(pg_catalog.=) %s THEN pg_catalog.format('%%s', %s) "
            "ELSE pg_catalog.format('[%%s, %%s]', %s, %s) END" % (lo, hi, lo, lo, hi))


def view_sql(req, view: str, output: str) -> str:
    """``CREATE VIEW view AS`` the labels of the relation ``output`` (qualified names)."""
    columns = ["o.ec_id"]
    for a in req.qis:
        if a.numerical:
            lo, hi = ("o.%s" % C.ident(c) for c in a.published_as())
            columns.append("%s AS %s" % (label_sql(lo, hi), C.ident(a.name)))
        else:
            columns.append("o.%s" % C.ident(a.name))
    columns += ["o.%s" % C.ident(c) for c in (req.sa.name,) + tuple(req.options.keep)]
    return "CREATE VIEW %s AS SELECT %s FROM %s AS o" % (view, ", ".join(columns), output)


def build(plpy, req, run, output: str) -> dict:
    """{SUFFIX: the view's temporary qualified name} when options.labels, else {}."""
    if not req.options.labels:
        return {}
    view = req.output.temporary_qualified(run.run_id, TAG)
    plpy.execute(view_sql(req, view, output))
    return {SUFFIX: view}
