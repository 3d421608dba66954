"""The default is never above t-Mondrian through the SQL API (issue 28 audit): a seeded corpus
of small random tables of every QI type sabre_anonymize takes (integer, float8, numeric, date,
text, text with a hierarchy defined by sabre_define_hierarchy), skewed, tied, constant, residue,
duplicated-row and SA-as-a-function-of-a-QI shapes, random weights, one to three SAs of every
kind (numerical, flat, hierarchical); 'refine' (the default) and 'mondrian' both run through
sabre_anonymize and their reported AIL is compared.  (The audit itself ran 270 such tables of
200-19,510 rows: never above; tests/core/test_default_vs_mondrian.py checks the core.)"""
from __future__ import annotations

import json

import numpy as np
import psycopg

SEED = 28
TABLES = 14
SHAPES = ["plain", "skewed", "tied", "constant_qi", "residue", "sorted_sa", "one_value", "sa_fn_of_qi", "dup_rows"]


def hierarchy_rows(rng, leaves: int, name: str) -> str:
    height, fanout = int(rng.integers(1, 4)), int(rng.integers(2, 5))
    return "\n".join(";".join(["%s%d" % (name, leaf)] + ["%s_%d_%d" % (name, level, leaf // fanout // 2 ** (level - 1))
                                                          for level in range(1, height)] + ["*"])
                     for leaf in range(leaves))


def random_table(rng, i: int) -> dict:
    n = int(rng.choice([200, 400, 700, 1200]))
    shape = SHAPES[i % len(SHAPES)]
    latent = rng.integers(0, int(rng.choice([3, 10, 50])), n)
    cols, types, hierarchies, qis = {}, {}, {}, []
    for j in range(int(rng.integers(1, 6))):
        kind = str(rng.choice(["integer", "float8", "numeric", "date", "text", "htext"]))
        v = {"residue": lambda: (np.arange(n) * 7) % 83, "tied": lambda: rng.integers(0, 3, n),
             "skewed": lambda: np.minimum(rng.zipf(1.4, n), 500)}.get(shape, lambda: latent * 5 + rng.integers(0, 20, n))()
        if shape == "constant_qi" and j == 0:
            v = np.zeros(n, dtype=int)
        name = "q%d" % j
        qis.append(name)
        if kind == "htext":
            leaves, h = int(rng.integers(2, 12)), "a28c_%d_%s" % (i, name)
            hierarchies[name] = (h, hierarchy_rows(rng, leaves, h + "_"))
            cols[name], types[name] = ["%s_%d" % (h, x % leaves) for x in v], "text"
        else:
            cols[name] = {"date": lambda: [str(np.datetime64("2000-01-01") + int(x)) for x in v],
                          "text": lambda: ["v%d" % (x % 40) for x in v], "numeric": lambda: ["%.2f" % (x / 3) for x in v],
                          }.get(kind, lambda: [str(int(x)) for x in v])()
            types[name] = kind
    sas = []
    for s in range(int(rng.choice([1, 2, 3]))):
        base = np.where(rng.random(n) < 0.92, 0, rng.integers(0, 30, n)) if shape == "one_value" else \
            latent * 3 + s if shape == "sa_fn_of_qi" else latent * 2 + rng.integers(0, int(rng.choice([2, 4, 20])), n)
        if shape == "sorted_sa":
            base = np.sort(base)
        name, kind = "s%d" % s, str(rng.choice(["integer", "flat", "hier"]))
        if kind == "hier":
            leaves, h = int(rng.integers(2, 10)), "a28c_%d_%s" % (i, name)
            hierarchies[name] = (h, hierarchy_rows(rng, leaves, h + "_"))
            cols[name], types[name] = ["%s_%d" % (h, x % leaves) for x in base], "text"
        else:
            cols[name] = [str(int(x)) for x in base] if kind == "integer" else ["x%d" % (x % 12) for x in base]
            types[name] = "integer" if kind == "integer" else "text"
        sas.append(name)
    if shape == "dup_rows":
        pick = rng.integers(0, n // 20, n)
        cols = {c: [v[p] for p in pick] for c, v in cols.items()}
    weights = {q: float(rng.choice([0.1, 1, 5])) for q in qis} if rng.random() < 0.3 else None
    return dict(cols=cols, types=types, hierarchies=hierarchies, qis=qis, sas=sas, weights=weights,
                ts=[float(rng.choice([0.05, 0.1, 0.2, 0.3, 0.45])) for _ in sas], k=int(rng.choice([2, 5, 10])))


def load(conn, table: str, spec: dict) -> None:
    for h, rows in spec["hierarchies"].values():
        conn.execute("SELECT sabre.sabre_define_hierarchy(%s, %s)", (h, rows))
    names = list(spec["cols"])
    conn.execute("CREATE TABLE public.%s (id serial PRIMARY KEY, %s)" % (
        table, ", ".join("%s %s" % (c, spec["types"][c]) for c in names)))
    with conn.cursor().copy("COPY public.%s (%s) FROM STDIN" % (table, ", ".join(names))) as copy:
        for row in zip(*(spec["cols"][c] for c in names)):
            copy.write_row(row)


def ail(conn, table: str, spec: dict, method: str) -> float:
    options = {"hierarchies": {c: h for c, (h, _) in spec["hierarchies"].items()}}
    if spec["weights"]:
        options["weights"] = spec["weights"]
    return conn.execute(
        "SELECT r.ail FROM sabre.sabre_anonymize(source => %s::regclass, quasi_identifiers => %s::text[], "
        "sensitive => %s::text[], t => %s::float8[], k => %s, method => %s, output => %s, options => %s::jsonb) AS r",
        ("public." + table, spec["qis"], spec["sas"], spec["ts"], spec["k"], method, "public.%s_%s" % (table, method),
         json.dumps(options))).fetchone()[0]


def test_the_default_is_never_above_mondrian_through_sql(pg_conn):
    rng = np.random.default_rng(SEED)
    for i in range(TABLES):
        spec = random_table(rng, i)
        load(pg_conn, "corpus_%d" % i, spec)
        found = {m: ail(pg_conn, "corpus_%d" % i, spec, m) for m in ("refine", "mondrian")}
        assert found["refine"] <= found["mondrian"] + 1e-12, (i, spec["qis"], spec["sas"], found)
