"""``sabre-pg bench --quick --multi-sa`` runs end to end (census with hours, and Adult with
occupation + education) and its results hold their guarantees."""
from __future__ import annotations

import json

import numpy as np
import psycopg

from sabre_pg import cli
from sabre_pg.arx import load_arx
from sabre_pg.bench import multi_sa
from sabre_pg.core import metrics
from sabre_pg.core.generalize import ECIndex
from sabre_pg.core.sabre import generalize_classes


def test_bench_multi_sa_quick(pg_dsn, shared_dir, tmp_path):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('public.adult')").fetchone()[0] is None:
            load_arx(conn, shared_dir / "adult" / "adult.csv", table="adult")
    out = tmp_path / "bench-out"
    assert cli.main(["bench", "--dsn", pg_dsn, "--out", str(out), "--quick", "--multi-sa"]) == 0
    doc = json.loads((out / "multi_sa.json").read_text())
    assert doc["adult"] is True
    by = {(r["data"], r["method"]): r for r in doc["runs"]}
    assert set(by) == {(data, method) for data, sas in (("census", ("salary", "hours")),
                                                         ("adult", ("occupation", "education")))
                       for method in ("refine", "auto", "mondrian") + tuple("single:" + sa for sa in sas)}
    assert by["census", "auto"]["rows"] == 5000 and by["adult", "refine"]["rows"] > 30000
    for (data, method), r in by.items():
        if not method.startswith("single:"):       # several SAs: every class within every t
            assert r["violations"] == 0, (data, method)
            assert all(e <= t + 1e-9 for e, t in zip(r["max_emd"], r["t"])), (data, method)
        singles = [by[data, m]["ail"] for d, m in by if d == data and m.startswith("single:")]
        assert r["ail_above_worse_single"] == round(r["ail"] - max(singles), 4)
    text = (out / "multi_sa.md").read_text()
    assert "Cost of the second SA (census, refine)" in text and "Cost of the second SA (adult, auto)" in text
    assert (out / "fig_multi_sa.png").stat().st_size > 0
    with psycopg.connect(pg_dsn) as conn:             # outputs and the hours table dropped
        left = conn.execute("SELECT relname FROM pg_class WHERE relname LIKE 'bench\\_multi\\_%'").fetchall()
    assert left == []


def test_reference_mondrian_ail_is_the_servers(pg_conn):
    """The reference Mondrian's AIL is on the server's scale: the core AIL of the server's own
    classes (read from the side table) equals the AIL sabre_anonymize reports."""
    data = multi_sa.create_census_hours(pg_conn, "bench_multi_scale", 2000)
    qis, codes, domains = multi_sa.load_arrays(pg_conn, data, "sabre")
    bench = multi_sa.MultiSABench(pg_conn, 5, "sabre")
    [default, *_] = bench.run(data | {"arrays": (qis, codes, domains)}, [0.25, 0.25], "scale")
    ec = np.array([r[0] for r in pg_conn.execute(
        "SELECT ec_id FROM public.bench_multi_census_scale_refine_keys ORDER BY key").fetchall()])
    _, ec = np.unique(ec, return_inverse=True)
    index = ECIndex(ec)
    assert abs(metrics.ail(generalize_classes(qis, index)[1], index.sizes) - default["ail"]) < 1e-4
    bench.drop_outputs()
    pg_conn.execute("DROP TABLE public.bench_multi_scale")
