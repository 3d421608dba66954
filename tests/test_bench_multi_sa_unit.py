"""Unit tests of ``sabre-pg bench --multi-sa`` without a database: the reference Mondrian, the
check of every SA, the cost of the second SA, the report and the command line."""
from __future__ import annotations

import numpy as np

from sabre_pg.bench import multi_sa, parse
from sabre_pg.core.emd import SADomain
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.sabre import QuasiIdentifier


def two_sa_table(n=600, seed=3):
    """Two QIs, a numerical SA correlated with the first QI and a flat categorical SA."""
    rng = np.random.default_rng(seed)
    age = rng.integers(20, 70, n).astype(np.float64)
    zone = rng.integers(0, 8, n).astype(np.float64)
    salary = np.clip((age - 20) // 5 + rng.integers(0, 3, n), 0, 11).astype(np.int64)
    kind = rng.integers(0, 4, n).astype(np.int64)
    domains = [SADomain("numerical", m=12), SADomain("categorical", hierarchy=Hierarchy.flat(list("abcd")))]
    return [QuasiIdentifier("age", age), QuasiIdentifier("zone", zone)], np.column_stack([salary, kind]), domains


def emd_numerical(p, q):
    return float(np.abs(np.cumsum(p - q)).sum() / (len(p) - 1))


def test_reference_mondrian_keeps_k_and_every_t():
    qis, codes, domains = two_sa_table()
    ts = [0.15, 0.1]
    ec, index, il = multi_sa.mondrian(qis, codes, domains, ts, 5)
    assert index.n_classes > 1 and index.sizes.min() >= 5 and len(il) == index.n_classes
    table = [np.bincount(codes[:, i], minlength=d.m) / len(codes) for i, d in enumerate(domains)]
    for c in range(index.n_classes):
        rows = ec == c
        p = [np.bincount(codes[rows, i], minlength=d.m) / rows.sum() for i, d in enumerate(domains)]
        assert emd_numerical(p[0], table[0]) <= ts[0] + 1e-9
        assert 0.5 * np.abs(p[1] - table[1]).sum() <= ts[1] + 1e-9
    # t near 0 on one SA: no half is as close as that, the table stays one class
    assert multi_sa.mondrian(qis, codes, domains, [1.0, 1e-12], 5)[1].n_classes == 1


def test_measure_checks_every_sa_and_counts_classes_over_some_t():
    qis, codes, domains = two_sa_table()
    by_salary = codes[:, 0] * 10 + 7              # one class per salary value: far from the table on salary
    r = multi_sa.measure("x", 1.23456, by_salary, 0.5, codes, domains, [0.1, 0.5])
    assert r["classes"] == len(np.unique(codes[:, 0])) and r["violations"] > 0
    assert r["max_emd"][0] > 0.1 and r["t"] == [0.1, 0.5] and r["seconds"] == 1.235
    whole = multi_sa.measure("y", 0, np.zeros(len(codes), dtype=np.int64), 0.9, codes, domains, [0.1, 0.1])
    assert whole["classes"] == 1 and whole["violations"] == 0 and whole["max_emd"] == [0.0, 0.0]


def runs(data="census"):
    return multi_sa.add_cost_of_second_sa([
        {"data": data, "title": data, "method": m, "t": [0.2, 0.15], "classes": 10, "ail": ail, "seconds": s,
         "max_emd": [0.1, 0.1], "violations": v}
        for m, ail, s, v in (("refine", 0.24, 1.5, 0), ("auto", 0.6, 1.0, 0), ("single:salary", 0.45, 0.5, 3),
                             ("single:hours", 0.55, 0.4, 2), ("mondrian", 0.3, 2.0, 0))])


def test_cost_of_the_second_sa_is_above_the_worse_single_run():
    cost = {r["method"]: r["ail_above_worse_single"] for r in runs()}
    assert cost == {"refine": -0.31, "auto": 0.05, "single:salary": -0.1, "single:hours": 0.0, "mondrian": -0.25}


def test_report_plot_and_plan(tmp_path):
    rs = runs("census") + runs("adult")
    text = multi_sa.report(rs, multi_sa.QUICK, 3.0)
    assert "| 0.2, 0.15 | auto | 10 | 0.6000 | +0.0500 | 1.00 | 0.100, 0.100 | 0 |" in text
    assert "Cost of the second SA (census, auto): +0.0500" in text and "Cost of the second SA (adult, refine)" in text
    assert "refine against the reference Mondrian (census): -20.0%" in text
    multi_sa.plot(rs, tmp_path)
    assert (tmp_path / "fig_multi_sa.png").stat().st_size > 0
    assert multi_sa.planned(multi_sa.DEFAULT, True) == 5 * 8 and multi_sa.planned(multi_sa.QUICK, False) == 5
    assert multi_sa.t_tag([0.2, 0.15]) == "02_015"


def test_the_flag_is_an_experiment_of_its_own():
    assert parse(["--multi-sa", "--quick"]).multi_sa and not parse(["--quick"]).multi_sa
