"""sabre_define_hierarchy: parse, validate (core.hierarchy) and store an ARX hierarchy."""
from __future__ import annotations

from sabre_pg.core.hierarchy import Hierarchy, HierarchyError, parse_arx

from . import common as C


def define(plpy, name, csv, delimiter=";"):
    if name is None or str(name).strip() == "":
        C.fail(plpy, C.INVALID_PARAMETER, "hierarchy name must not be empty",
               "Name the hierarchy, e.g. sabre_define_hierarchy('marital_h', csv).")
    if csv is None or csv.strip() == "":
        C.fail(plpy, C.INVALID_PARAMETER, 'hierarchy "%s" has no rows' % name,
               "Pass ARX-format text: one row per leaf, leaf;level1;...;root.")
    if delimiter is None or len(delimiter) == 0:
        C.fail(plpy, C.INVALID_PARAMETER, "the delimiter must not be empty",
               "The ARX format uses ';'.")
    text = csv.lstrip("\ufeff")
    try:
        h = Hierarchy(parse_arx(text, delimiter), name=name)
    except HierarchyError as e:
        C.fail(plpy, C.BAD_FILE_FORMAT, "malformed hierarchy: %s" % e,
               "Every row must be leaf%slevel1%s...%sroot with the same number of fields, one root, "
               "one parent per node and unique leaves." % (delimiter, delimiter, delimiter))
    schema = plpy.quote_ident(C.sabre_schema(plpy))
    plpy.execute(plpy.prepare("DELETE FROM %s.hierarchies WHERE name = $1" % schema, ["text"]), [name])
    plpy.execute(plpy.prepare(
        "INSERT INTO %s.hierarchies (name, height, leaves, root) VALUES ($1, $2, $3, $4)" % schema,
        ["text", "int", "int", "text"]), [name, h.height, h.n_leaves, h.labels[h.root]])
    w = h.height + 1
    flat = [v for r in h.rows for v in r]          # rows in pre-order, w labels each
    plpy.execute(plpy.prepare(
        "INSERT INTO %s.hierarchy_rows (hierarchy, ord, path) "
        "SELECT $1, i, $2[i * $3 + 1:(i + 1) * $3] FROM generate_series(0, $4 - 1) AS i" % schema,
        ["text", "text[]", "int", "int"]), [name, flat, w, h.n_leaves])
    return [(name, h.n_leaves, h.height)]
