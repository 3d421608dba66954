"""sabre_instant's SQL (plpython/preflight/instant.py, pure) and its phase 2 without a server."""
from __future__ import annotations

import re

import numpy as np

from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.instant import hierarchy_levels, interval_levels
from tests.client.fake_plpy import sabre_plpy

instant = sabre_plpy("preflight.instant")
request = sabre_plpy("stages.request")

INT = {"type": "integer", "category": "N", "typname": "int4", "notnull": False}
TEXT = {"type": "text", "category": "S", "typname": "text", "notnull": False}


def make(l=None):
    h = Hierarchy([["a", "ab", "*"], ["b", "ab", "*"], ["c", "cd", "*"], ["d", "cd", "*"]])
    qis = (request.Attr("age", INT, "numerical"), request.Attr("c", TEXT, "categorical", "c_h"))
    sa = request.Attr("sa", TEXT, "categorical") if l else None
    opts = request.parse_options({}, {"age": INT, "c": TEXT}, qis)
    req = instant.InstantRequest({"qname": "public.t", "read": "public.t", "oid": 1}, {}, qis, sa, 5, l, 0.0, 0.5, "probability", 4,
                                 "marginals", False, False, "instant", opts, request.Output("public", "t_instant"), {})
    levels = (interval_levels("age", np.arange(20, 60), np.ones(40), True),
              hierarchy_levels("c", h, np.ones(4)))
    return instant.Generalizer(req, levels, {"c": h})


def test_grouping_ids_follow_postgres_bit_order():
    gen = make()
    nodes = [(1, 0), (0, 1), (gen.levels[0].top, 2)]
    sql, ids, bad = gen.validation(nodes, True)
    names = re.search(r"GROUPING\((.*?)\) AS g", sql).group(1).split(", ")
    assert names == ["x.c0_0", "x.c0_1", "x.c1_0", "x.c1_1", "x.bad"]
    # the rightmost argument is the least significant bit; a bit is set when not grouped
    assert ids[(1, 0)] == 0b10011 and ids[(0, 1)] == 0b01101
    assert ids[(gen.levels[0].top, 2)] == 0b11111 and bad == 0b11110
    assert "GROUPING SETS ((x.c0_1, x.c1_0), (x.c0_0, x.c1_1), (), (x.bad))" in sql
    assert len(set(ids.values()) | {bad}) == 4


def test_interval_lm_is_null_safe_and_l_counts_distinct_values():
    gen = make(l=3)
    lm = gen.lm(0, 1, "b.c0_1")
    assert lm.startswith("CASE WHEN b.c0_1 IS NOT NULL")     # GREATEST/LEAST skip NULLs
    sql, _, _ = gen.validation([(1, 1)], False)
    assert "pg_catalog.count(DISTINCT x.sa) AS d" in sql and "b.d >= 3" in sql and "x.bad" not in sql


def test_materialize_keeps_only_passing_classes():
    gen = make(l=2)
    sql = gen.materialize((1, gen.levels[1].top), "public.tmp")
    assert "HAVING pg_catalog.count(*) >= 5 AND pg_catalog.count(DISTINCT x.\"sa\") >= 2" in sql
    assert "GROUP BY x.k0" in sql and "ORDER BY pg_catalog.random()" in sql
    assert "AS \"age_lo\"" in sql and "AS \"c\"" in sql


class Scripted:
    """A validator answering from a set of nodes that pass on 'the data'."""

    def __init__(self, passing, req, levels):
        self.passing, self.req, self.scans, self.tried = passing, req, 0, 0
        self.gen = type("G", (), {"levels": levels})()

    def check(self, nodes):
        self.scans += 1
        self.tried += len(nodes)
        return {v: instant.Checked(v, 100, 3, 0 if v in self.passing else 10, 0.1 * v[0] + 0.2 * v[1]) for v in nodes}


def test_phase2_skips_nodes_below_a_failure_and_takes_the_batch_minimum():
    gen = make()
    top = tuple(q.top for q in gen.levels)
    passing = {(3, 1), (2, 2), (4, 1), top}
    v = Scripted(passing, gen.req, gen.levels)
    # first batch fails entirely; (1, 0) is below the failed (2, 0) and is skipped
    chosen = instant.phase2(v, [(2, 0), (2, 1), (1, 1), (0, 2), (1, 0), (4, 1), (3, 1), (2, 2)], top)
    assert v.scans == 2 and v.tried == 8            # the second batch: (4, 1), (3, 1), (2, 2), the top
    assert chosen.node == (3, 1)                    # least exact LM among the batch's passing nodes

