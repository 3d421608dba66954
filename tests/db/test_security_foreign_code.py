"""Issue 25, finding 1: a data owner's code must not run in a sabre call, through a cast, a
domain's CHECK or an output column typed by the owner's type (plpython/shared/safe_types.py).

Roles: the DBA (the test's superuser connection), an analyst ``fc_analyst`` with USAGE on
``sabre`` and ``search_path = public, sabre``, and a data owner ``fc_owner`` who owns the
source, its types and the plants.  Every planted function writes ``current_user`` into
``fc_own.log`` (INSERT granted to PUBLIC) and tries to make its owner a superuser; each test
asserts that the log stays empty and the owner stays a plain role.
"""
from __future__ import annotations

import json

import psycopg
import pytest

ROLES = ("fc_analyst", "fc_owner")
ROWS = 480

# a planted function body: log who ran it, try to escalate, return a harmless value
SPY = ("BEGIN INSERT INTO fc_own.log VALUES (current_user, %s); "
       "BEGIN ALTER ROLE fc_owner SUPERUSER; EXCEPTION WHEN OTHERS THEN NULL; END; RETURN %s; END")


def _spy(conn, name, args, returns, what, value):
    conn.execute("CREATE FUNCTION fc_own.%s(%s) RETURNS %s LANGUAGE plpgsql AS $$%s$$" % (
        name, args, returns, SPY % ("'%s'" % what, value)))


def _plant_types(owner):
    """The owner's enums and domains; each domain's CHECK calls a planted function."""
    owner.execute("CREATE TABLE fc_own.log (who name, what text)")
    owner.execute("GRANT INSERT, SELECT ON fc_own.log TO PUBLIC")
    for enum, labels in (("grade", "'g1','g2','g3','g4'"), ("diag", "'flu','cold','cough','rash','none'")):
        owner.execute("CREATE TYPE fc_own.%s AS ENUM (%s)" % (enum, labels))
    # domains whose CHECK calls the owner's function: over int, bigint, text, numeric, date
    for domain, base in (("ident", "integer"), ("years", "integer"), ("seqno", "bigint"), ("postcode", "text"),
                         ("amount", "numeric(12,2)"), ("day", "date")):
        _spy(owner, domain + "_ok", base.split("(")[0], "boolean", "check " + domain, "true")
        owner.execute("CREATE DOMAIN fc_own.%s AS %s CHECK (fc_own.%s_ok(VALUE))" % (domain, base, domain))


def _plant_casts(owner):
    """Casts of the owner's enums (none of them the issue's own): to text (implicit), varchar
    (assignment) and integer (explicit), and from text to the enum and to its array type."""
    for enum in ("grade", "diag"):
        # (the label itself, so a run that calls them goes on and only the log tells)
        _spy(owner, enum + "_text", "fc_own.%s" % enum, "text", enum + " to text", "pg_catalog.textin(pg_catalog.enum_out($1))")
        _spy(owner, enum + "_varchar", "fc_own.%s" % enum, "varchar", enum + " to varchar",
             "pg_catalog.textin(pg_catalog.enum_out($1))")
        _spy(owner, enum + "_int", "fc_own.%s" % enum, "integer", enum + " to int", "7")
        _spy(owner, enum + "_from_text", "text", "fc_own.%s" % enum, "text to " + enum,
             "pg_catalog.enum_in(pg_catalog.textout($1), 'fc_own.%s'::regtype)" % enum)
        _spy(owner, enum + "_array", "text", "fc_own.%s[]" % enum, "text to %s[]" % enum,
             "pg_catalog.array_in(pg_catalog.textout($1), 'fc_own.%s'::regtype, -1)" % enum)
        owner.execute("CREATE CAST (fc_own.%s AS text) WITH FUNCTION fc_own.%s_text(fc_own.%s) AS IMPLICIT"
                      % (enum, enum, enum))
        owner.execute("CREATE CAST (fc_own.%s AS varchar) WITH FUNCTION fc_own.%s_varchar(fc_own.%s) AS ASSIGNMENT"
                      % (enum, enum, enum))
        owner.execute("CREATE CAST (fc_own.%s AS integer) WITH FUNCTION fc_own.%s_int(fc_own.%s)" % (enum, enum, enum))
        owner.execute("CREATE CAST (text AS fc_own.%s) WITH FUNCTION fc_own.%s_from_text(text)" % (enum, enum))
        owner.execute("CREATE CAST (text AS fc_own.%s[]) WITH FUNCTION fc_own.%s_array(text)" % (enum, enum))


def _source(owner, table="fc_own.visits", rows=ROWS):
    """Every column of an owner's enum or domain type."""
    owner.execute(
        "CREATE TABLE %s (id fc_own.ident PRIMARY KEY, seq fc_own.seqno NOT NULL, age fc_own.years, "
        "zip fc_own.postcode, grade fc_own.grade, income fc_own.amount, seen fc_own.day, diag fc_own.diag)" % table)
    owner.execute(
        "INSERT INTO %s SELECT g, g, 20 + (g * 7919) %% 50, 'z' || (g %% 6), "
        "(ARRAY['g1','g2','g3','g4'])[1 + g %% 4]::fc_own.grade, ((g * 31) %% 900) / 4.0, "
        "date '2020-01-01' + (g * 13) %% 365, (ARRAY['flu','cold','cough','rash','none'])[1 + (g * 104729) %% 5]::fc_own.diag "
        "FROM pg_catalog.generate_series(1, %d) g" % (table, rows))


@pytest.fixture
def roles(pg_conn, pg_connect):
    """{name: connection}: the DBA ("dba"), the analyst and the data owner, with the plants."""
    for r in ROLES:
        pg_conn.execute(f"DROP ROLE IF EXISTS {r}")
        pg_conn.execute(f"CREATE ROLE {r} LOGIN")
    pg_conn.execute("CREATE SCHEMA fc_analyst AUTHORIZATION fc_analyst")
    pg_conn.execute("GRANT USAGE ON SCHEMA sabre TO fc_analyst")
    pg_conn.execute("ALTER ROLE fc_analyst SET search_path = public, sabre")
    pg_conn.execute("CREATE SCHEMA fc_own AUTHORIZATION fc_owner")
    pg_conn.execute("CREATE SCHEMA fc_dba")
    conns = {r: pg_connect(user=r) for r in ROLES}
    conns["dba"] = pg_conn
    owner = conns["fc_owner"]
    owner.execute("GRANT USAGE ON SCHEMA fc_own TO PUBLIC")
    _plant_types(owner)
    _source(owner)
    _plant_casts(owner)
    owner.execute("GRANT SELECT ON fc_own.visits TO fc_analyst")
    owner.execute("ANALYZE fc_own.visits")
    owner.execute("DELETE FROM fc_own.log")      # (the owner's own inserts and ANALYZE, as the owner)
    pg_conn.execute("SELECT sabre_define_hierarchy('fc_grade', %s)",
                    ("g1;low;*\ng2;low;*\ng3;high;*\ng4;high;*",))
    yield conns
    for c in (conns["fc_analyst"], conns["fc_owner"]):
        c.close()
    pg_conn.execute("SELECT sabre_drop_hierarchy('fc_grade')")
    for schema in ("fc_analyst", "fc_own", "fc_dba"):
        pg_conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    for r in ROLES:
        pg_conn.execute(f"DROP OWNED BY {r}")
        pg_conn.execute(f"DROP ROLE {r}")


def _log(dba):
    return dba.execute("SELECT who, what FROM fc_own.log").fetchall()


def _assert_clean(dba):
    assert _log(dba) == []
    assert not dba.execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'fc_owner'").fetchone()[0]


def _anonymize(conn, output, method, sensitive="diag", t=0.4, qis=("age", "grade", "income"), k=5, **options):
    opts = dict({"hierarchies": {"grade": "fc_grade"}} if "grade" in qis else {}, **options)
    if isinstance(sensitive, list):
        return conn.execute(
            "SELECT rows, classes FROM sabre_anonymize('fc_own.visits'::regclass, %s::text[], %s::text[], "
            "%s::float8[], %s, %s, %s, %s::jsonb)",
            (list(qis), sensitive, [t] * len(sensitive), k, method, output, json.dumps(opts))).fetchone()
    return conn.execute(
        "SELECT rows, classes FROM sabre_anonymize('fc_own.visits'::regclass, %s::text[], %s, %s, %s, %s, %s, "
        "%s::jsonb)", (list(qis), sensitive, t, k, method, output, json.dumps(opts))).fetchone()


def _verify(conn, output, sensitive="diag", t=0.4, k=5):
    if isinstance(sensitive, list):
        return conn.execute("SELECT violations FROM sabre_verify(%s::regclass, %s::text[], %s::float8[], %s)",
                            (output, sensitive, [t] * len(sensitive), k)).fetchone()[0]
    return conn.execute("SELECT violations FROM sabre_verify(%s::regclass, %s, %s, %s)",
                        (output, sensitive, t, k)).fetchone()[0]


def _foreign_typed_columns(dba, schema):
    """(relation, column, type) of every column in ``schema`` whose type is not pg_catalog's."""
    return dba.execute(
        "SELECT c.relname, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod) FROM pg_class c "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
        "JOIN pg_type t ON t.oid = a.atttypid WHERE c.relnamespace = %s::regnamespace "
        "AND t.typnamespace <> 'pg_catalog'::regnamespace ORDER BY 1, 2", (schema,)).fetchall()


# ------------------------------------------------------------------ every entry point
@pytest.mark.parametrize("who", ["dba", "fc_analyst"])
def test_every_entry_point_runs_no_code_of_the_owner(roles, who):
    """Every entry point, as a superuser and as an analyst, over a source whose every column
    has an owner's enum (with casts to text, varchar, int and from text) or domain (with a
    CHECK): nothing of the owner runs, every run succeeds, and verifies with 0 violations."""
    dba, conn = roles["dba"], roles[who]
    schema = "fc_dba" if who == "dba" else "fc_analyst"
    out = lambda name: "%s.%s" % (schema, name)   # noqa: E731
    for method in ("refine", "ak", "knn", "mondrian"):
        rows, classes = _anonymize(conn, out("o_" + method), method)
        assert rows == ROWS and classes >= 1
        assert _verify(conn, out("o_" + method)) == 0
        _assert_clean(dba)
    # several sensitive attributes (an enum and a domain over numeric)
    rows, _ = _anonymize(conn, out("o_multi"), "ak", sensitive=["diag", "income"], t=0.6,
                         qis=("age", "grade", "zip"))
    assert rows == ROWS and _verify(conn, out("o_multi"), ["diag", "income"], 0.6) == 0
    # a domain SA (numeric) with keep columns of every kind
    rows, _ = _anonymize(conn, out("o_keep"), "refine", sensitive="income", t=0.6, qis=("age", "grade"),
                         keep=["seq", "zip", "seen"])
    assert rows == ROWS and _verify(conn, out("o_keep"), "income", 0.6) == 0
    _assert_clean(dba)
    # partitioned: in one backend, and the client's plan with staged rows
    rows, _ = _anonymize(conn, out("o_parts"), "refine", partitions=2)
    assert rows == ROWS and _verify(conn, out("o_parts")) == 0
    parts = conn.execute(
        "SELECT part_rows FROM sabre_partitions('fc_own.visits'::regclass, ARRAY['age','grade','income'], 'diag', "
        "0.4, 5, 'refine', %s, %s::jsonb, true)",
        (out("o_plan"), json.dumps({"hierarchies": {"grade": "fc_grade"}, "partitions": 2}))).fetchall()
    staged = [p for (p,) in parts if p]
    assert staged
    for p in staged:
        assert dba.execute("SELECT count(*) FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
                           "WHERE a.attrelid = %s::regclass AND a.attnum > 0 "
                           "AND t.typnamespace <> 'pg_catalog'::regnamespace", (p,)).fetchone()[0] == 0
        conn.execute("DROP TABLE %s" % p)
    _assert_clean(dba)
    # refresh reruns the run as it was made
    assert conn.execute("SELECT rows FROM sabre_refresh(%s)", (out("o_ak"),)).fetchone()[0] == ROWS
    _assert_clean(dba)
    # estimate (statistics only) and instant (statistics, then scans)
    est = conn.execute("SELECT classes FROM sabre_estimate('fc_own.visits'::regclass, ARRAY['age','grade'], 'diag', "
                       "ARRAY[0.3, 0.5]::float8[], 5, %s::jsonb)",
                       (json.dumps({"hierarchies": {"grade": "fc_grade"}}),)).fetchall()
    assert len(est) == 2
    est = conn.execute("SELECT classes FROM sabre_estimate('fc_own.visits'::regclass, ARRAY['age'], 'income', "
                       "0.5::float8, 5)").fetchall()
    assert len(est) == 1
    _assert_clean(dba)
    inst = conn.execute("SELECT output::text, classes FROM sabre_instant('fc_own.visits'::regclass, "
                        "ARRAY['age','income'], 5, NULL, NULL, 0.0, %s)", (out("o_instant"),)).fetchone()
    assert inst[1] >= 1
    assert conn.execute("SELECT violations FROM sabre_verify(%s::regclass, NULL::text, NULL::float8, 5)",
                        (inst[0],)).fetchone()[0] == 0
    inst = conn.execute("SELECT classes FROM sabre_instant('fc_own.visits'::regclass, ARRAY['age','grade'], 5, "
                        "2, 'diag', 0.0, %s, %s::jsonb)",
                        (out("o_instant2"), json.dumps({"hierarchies": {"grade": "fc_grade"}}))).fetchone()
    assert inst[0] >= 1
    _assert_clean(dba)
    # streams: create, advance, status, verify
    conn.execute("SELECT * FROM sabre_stream_create(name => %s, source => 'fc_own.visits'::regclass, arrival => 'seq', "
                 "quasi_identifiers => ARRAY['age','grade'], sensitive => 'diag', t => 0.5, k => 4, window_size => 160, "
                 "step => 80, output => %s, options => %s::jsonb)",
                 ("fc_w_" + who, out("o_stream"), json.dumps({"hierarchies": {"grade": "fc_grade"}})))
    advanced = conn.execute("SELECT * FROM sabre_stream_advance(%s)", ("fc_w_" + who,)).fetchall()
    assert advanced
    conn.execute("SELECT * FROM sabre_stream_status(%s)", ("fc_w_" + who,)).fetchone()
    v = conn.execute("SELECT violations, updated, deleted FROM sabre_stream_verify(%s)", ("fc_w_" + who,)).fetchone()
    assert v == (0, 0, 0)
    _assert_clean(dba)
    # nothing sabre made in the caller's schema is typed by the owner's types
    assert _foreign_typed_columns(dba, schema) == []
    conn.execute("SELECT sabre_stream_drop(%s, true)", ("fc_w_" + who,))


# ------------------------------------------------------------------ single plants
def test_superuser_domain_check_does_not_escalate(roles):
    """A DBA anonymizes a table whose numerical QI is a domain over date with a CHECK that tries
    ALTER ROLE ... SUPERUSER: the CHECK never runs (the output's _lo/_hi are dates)."""
    dba = roles["dba"]
    rows, _ = _anonymize(dba, "fc_dba.o_dates", "mondrian", qis=("seen", "zip"), sensitive="diag", t=0.5)
    assert rows == ROWS
    _assert_clean(dba)
    types = dict(dba.execute("SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                             "WHERE a.attrelid = 'fc_dba.o_dates_classes'::regclass AND a.attnum > 0").fetchall())
    assert types["seen_lo"] == types["seen_hi"] == "date"


def test_array_cast_not_called_by_estimate(roles):
    """sabre_estimate reads pg_stats' values as text: the owner's cast text -> diag[] (and
    text -> diag) is never called, as the analyst or the DBA."""
    for who in ("fc_analyst", "dba"):
        found = roles[who].execute(
            "SELECT classes FROM sabre_estimate('fc_own.visits'::regclass, ARRAY['age'], 'diag', 0.3::float8, 5)"
        ).fetchall()
        assert found
    _assert_clean(roles["dba"])


def test_outputs_take_built_in_types_and_survive_drop_cascade(roles):
    """The output, its _classes and _keys take built-in base types (integer for a domain over
    integer, text for an owner's enum): after the owner's DROP ... CASCADE of every type, the
    analyst's relations keep all their columns."""
    dba, analyst, owner = roles["dba"], roles["fc_analyst"], roles["fc_owner"]
    _anonymize(analyst, "fc_analyst.o_types", "refine", sensitive="diag", keep=["seq", "zip", "seen"])
    _anonymize(analyst, "fc_analyst.o_multi", "ak", sensitive=["diag", "income"], t=0.6, qis=("age", "grade"))
    before = {r: analyst.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                                 "AND NOT attisdropped", (r,)).fetchone()[0]
              for r in ("fc_analyst.o_types", "fc_analyst.o_types_classes", "fc_analyst.o_multi",
                        "fc_analyst.o_multi_classes")}
    assert _foreign_typed_columns(dba, "fc_analyst") == []
    types = dict(dba.execute("SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                             "WHERE a.attrelid = 'fc_analyst.o_types'::regclass AND a.attnum > 0").fetchall())
    assert types["age_lo"] == "integer" and types["income_lo"] == "numeric(12,2)"
    assert types["diag"] == "text" and types["seq"] == "bigint" and types["seen"] == "date"
    owner.execute("DROP TABLE fc_own.visits")
    for t in ("DOMAIN fc_own.ident", "DOMAIN fc_own.years", "DOMAIN fc_own.seqno", "DOMAIN fc_own.postcode",
              "DOMAIN fc_own.amount", "DOMAIN fc_own.day", "TYPE fc_own.grade", "TYPE fc_own.diag"):
        owner.execute("DROP %s CASCADE" % t)
    for r, n in before.items():
        assert analyst.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                               "AND NOT attisdropped", (r,)).fetchone()[0] == n
    assert analyst.execute("SELECT count(*) FROM fc_analyst.o_types").fetchone()[0] == ROWS


def test_composite_and_range_keep_columns_read_by_output_function(roles):
    """Keep columns of the owner's composite and range types, each with a planted cast to text,
    are published as text through record_out / range_out: no cast runs."""
    dba, analyst, owner = roles["dba"], roles["fc_analyst"], roles["fc_owner"]
    owner.execute("CREATE TYPE fc_own.pair AS (a integer, b fc_own.grade)")
    owner.execute("CREATE TYPE fc_own.span AS RANGE (subtype = integer)")
    _spy(owner, "pair_text", "fc_own.pair", "text", "pair to text", "pg_catalog.textin(pg_catalog.record_out($1))")
    _spy(owner, "span_text", "fc_own.span", "text", "span to text", "pg_catalog.textin(pg_catalog.range_out($1))")
    owner.execute("CREATE CAST (fc_own.pair AS text) WITH FUNCTION fc_own.pair_text(fc_own.pair) AS IMPLICIT")
    owner.execute("CREATE CAST (fc_own.span AS text) WITH FUNCTION fc_own.span_text(fc_own.span) AS ASSIGNMENT")
    owner.execute("ALTER TABLE fc_own.visits ADD COLUMN p fc_own.pair, ADD COLUMN s fc_own.span")
    owner.execute("UPDATE fc_own.visits SET p = ROW(id, grade)::fc_own.pair, s = fc_own.span(id, id + 3)")
    owner.execute("DELETE FROM fc_own.log")
    _anonymize(analyst, "fc_analyst.o_rows", "ak", keep=["p", "s"])
    _assert_clean(dba)
    got = analyst.execute("SELECT p, s FROM fc_analyst.o_rows WHERE p LIKE '(7,%'").fetchone()
    assert got == ("(7,g4)", "[7,10)")
    assert _verify(analyst, "fc_analyst.o_rows") == 0


def test_owner_output_function_is_refused(roles):
    """A type whose output function belongs to a role that is not a superuser (a superuser made
    the type with it) cannot be read safely: 42804 with a HINT, and nothing of it runs."""
    dba, analyst = roles["dba"], roles["fc_analyst"]
    dba.execute("CREATE TYPE fc_own.blob")
    dba.execute("CREATE FUNCTION fc_own.blob_in(cstring) RETURNS fc_own.blob LANGUAGE internal IMMUTABLE STRICT "
                "AS 'textin'")
    dba.execute("CREATE FUNCTION fc_own.blob_out(fc_own.blob) RETURNS cstring LANGUAGE internal IMMUTABLE STRICT "
                "AS 'textout'")
    dba.execute("CREATE TYPE fc_own.blob (INPUT = fc_own.blob_in, OUTPUT = fc_own.blob_out, LIKE = text, "
                "CATEGORY = 'S')")
    dba.execute("ALTER FUNCTION fc_own.blob_out(fc_own.blob) OWNER TO fc_owner")
    dba.execute("ALTER TYPE fc_own.blob OWNER TO fc_owner")
    owner = roles["fc_owner"]
    owner.execute("ALTER TABLE fc_own.visits ADD COLUMN b fc_own.blob")
    owner.execute("UPDATE fc_own.visits SET b = ('b' || (id % 3))::text::fc_own.blob")
    for who in ("fc_analyst", "dba"):
        with pytest.raises(psycopg.Error) as e:
            roles[who].execute("SELECT * FROM sabre_anonymize('fc_own.visits'::regclass, ARRAY['age','b'], 'diag', "
                               "0.5, 5, 'ak', 'fc_analyst.o_blob')")
        assert e.value.sqlstate == "42804"
        assert 'column "b"' in e.value.diag.message_primary and "cannot be read safely" in e.value.diag.message_primary
        assert "output function" in (e.value.diag.message_hint or "")
    # the column unused: the run goes on without it
    assert _anonymize(analyst, "fc_analyst.o_noblob", "ak")[0] == ROWS
    _assert_clean(dba)


# ------------------------------------------------------------------ the rule itself (no server)
def _row(**kw):
    row = dict(attname="c", attnotnull=False, declared="owner.t", domain=False, type="integer", typname="int4",
               category="N", trusted=True, output="pg_catalog.int4out", output_trusted=True)
    row.update(kw)
    return row


def test_safe_types_rule():
    """One decision per column: a superuser's base type is read as itself (a domain by a
    relabel), another role's type as text through a superuser's output function, anything
    else is refused; a relation needing no conversion is read as it is."""
    from tests.client.fake_plpy import sabre_plpy
    S = sabre_plpy("shared.safe_types")
    assert S.column(_row(declared="integer"))["read"] is None
    domain = S.column(_row(domain=True))
    assert domain["read"] == ("(", ")::integer") and domain["type"] == "integer" and not domain["converted"]
    enum = S.column(_row(type="owner.mood", typname="mood", category="E", trusted=False,
                         output="pg_catalog.enum_out"))
    assert (enum["type"], enum["category"], enum["converted"]) == ("text", "E", True)
    assert "x".join(enum["read"]) == "pg_catalog.textin(pg_catalog.enum_out(x))"
    refused = S.column(_row(trusted=False, output='"owner".blob_out', output_trusted=False))
    assert refused["unsafe"] and refused["category"] == "U"
    with pytest.raises(Exception) as e:
        S.read_sql("s.t", {"b": refused}, ["b"])
    assert e.value.sqlstate == "42804" and "output function" in e.value.hint
    plain = {"a": S.column(_row(declared="integer"))}
    assert S.read_sql("s.t", plain, ["a"]) == "s.t"
    assert S.read_sql("s.t", dict(plain, m=enum, b=refused), ["a", "m"]) == (
        '(SELECT r."a" AS "a", pg_catalog.textin(pg_catalog.enum_out(r."m")) AS "m" FROM s.t AS r)')


# ------------------------------------------------------------------ collations and domains over the owner's types
def _collations(dba, schema):
    """(relation, column, collation) of every column in ``schema`` whose collation is not the
    database's default (0: the type has none)."""
    return dba.execute(
        "SELECT c.relname, a.attname, a.attcollation::regcollation::text FROM pg_class c "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
        "WHERE c.relnamespace = %s::regnamespace AND a.attcollation NOT IN (0, 'pg_catalog.default'::regcollation) "
        "ORDER BY 1, 2", (schema,)).fetchall()


def _columns_of(conn, schema):
    """{relation: [column, ...]} of every table in ``schema``."""
    found = {}
    for rel, col in conn.execute(
            "SELECT c.relname, a.attname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 "
            "AND NOT a.attisdropped WHERE c.relnamespace = %s::regnamespace AND c.relkind = 'r' ORDER BY 1, a.attnum",
            (schema,)).fetchall():
        found.setdefault(rel, []).append(col)
    return found


@pytest.mark.parametrize("who", ["dba", "fc_analyst"])
def test_owner_collation_does_not_reach_the_output(roles, who):
    """The owner's ICU collation on a text QI, on the text SA, on a keep column and through a
    domain (COLLATE in the domain): nothing sabre creates (output, _classes, _keys, staged
    partitions, a stream's tables) takes it, so the owner's DROP COLLATION ... CASCADE leaves every output column
    in place and the outputs still verify."""
    dba, conn, owner = roles["dba"], roles[who], roles["fc_owner"]
    schema = "fc_dba" if who == "dba" else "fc_analyst"
    owner.execute("CREATE COLLATION fc_own.nordic (provider = icu, locale = 'fi-FI')")
    owner.execute("CREATE DOMAIN fc_own.wardname AS text COLLATE fc_own.nordic")
    owner.execute("ALTER TABLE fc_own.visits ADD COLUMN ward text COLLATE fc_own.nordic, "
                  "ADD COLUMN unit fc_own.wardname, ADD COLUMN finding varchar(12) COLLATE fc_own.nordic, "
                  "ADD COLUMN memo fc_own.wardname")
    owner.execute("UPDATE fc_own.visits SET ward = 'w' || (id % 4), unit = 'u' || (id % 3), "
                  "finding = (ARRAY['ok','mild','severe','acute'])[1 + (id * 7) % 4], memo = 'm' || id")
    assert _collations(dba, "fc_own")       # (the plants are in place)
    runs = [("o_text", "ak", "finding", ("age", "ward", "unit"), {"keep": ["memo"]}),
            ("o_dom", "refine", "finding", ("ward", "income"), {"keep": ["unit"], "partitions": 2}),
            ("o_multi", "mondrian", ["finding", "diag"], ("age", "unit"), {"keep": ["memo"]})]
    for name, method, sa, qis, opts in runs:
        rows, _ = _anonymize(conn, "%s.%s" % (schema, name), method, sensitive=sa, t=0.6, qis=qis, **opts)
        assert rows == ROWS
    # a stream over the same columns: its output and work tables too
    stream = "fc_coll_" + who
    conn.execute("SELECT * FROM sabre_stream_create(name => %s, source => 'fc_own.visits'::regclass, arrival => 'seq', "
                 "quasi_identifiers => ARRAY['age','ward'], sensitive => 'finding', t => 0.6, k => 4, "
                 "window_size => 160, step => 80, output => %s)", (stream, schema + ".o_stream"))
    assert conn.execute("SELECT * FROM sabre_stream_advance(%s)", (stream,)).fetchall()
    assert conn.execute("SELECT violations FROM sabre_stream_verify(%s)", (stream,)).fetchone()[0] == 0
    assert _collations(dba, schema) == []
    conn.execute("SELECT sabre_stream_drop(%s, true)", (stream,))
    before = _columns_of(dba, schema)
    assert {"o_text", "o_text_classes", "o_dom", "o_dom_classes", "o_multi"} <= set(before)
    assert "ward" in before["o_text"] and "memo" in before["o_text"] and "unit" in before["o_dom"]
    owner.execute("DROP COLLATION fc_own.nordic CASCADE")
    assert _columns_of(dba, schema) == before
    assert _verify(conn, "%s.o_text" % schema, "finding", 0.6) == 0
    assert _verify(conn, "%s.o_dom" % schema, "finding", 0.6) == 0
    assert _verify(conn, "%s.o_multi" % schema, ["finding", "diag"], 0.6) == 0
    assert conn.execute("SELECT count(DISTINCT memo) FROM %s.o_text" % schema).fetchone()[0] == ROWS
    _assert_clean(dba)


@pytest.mark.parametrize("collation_owner", ["fc_owner", "dba"])
def test_nondeterministic_collation_reads_values_as_distinct(roles, collation_owner):
    """A nondeterministic (case- and accent-blind) collation, the owner's or a superuser's, on a
    QI and on the SA whose values differ only in case or accents: the run reads them with the
    default collation, so SQL and Python see the same distinct values; it succeeds with 0
    violations and the output keeps every variant of the SA apart."""
    dba, analyst, owner = roles["dba"], roles["fc_analyst"], roles["fc_owner"]
    maker = roles[collation_owner]
    coll = "fc_own.blind" if collation_owner == "fc_owner" else "public.fc_blind"
    maker.execute("CREATE COLLATION %s (provider = icu, locale = 'und-u-ks-level1', deterministic = false)" % coll)
    if collation_owner == "dba":
        dba.execute("GRANT USAGE ON SCHEMA public TO fc_owner")
    owner.execute("ALTER TABLE fc_own.visits ADD COLUMN clinic text COLLATE %s, ADD COLUMN symptom text COLLATE %s"
                  % (coll, coll))
    owner.execute("UPDATE fc_own.visits SET clinic = (ARRAY['north','North','NORTH','nörth'])[1 + id % 4], "
                  "symptom = (ARRAY['cough','Cough','COUGH','fever','Fever','févér'])[1 + (id * 7919) % 6]")
    distinct = owner.execute("SELECT count(DISTINCT symptom), count(DISTINCT clinic) FROM fc_own.visits").fetchone()
    assert distinct == (2, 1)                   # (as the collation sees them)
    for who, method in (("fc_analyst", "ak"), ("dba", "refine"), ("fc_analyst", "mondrian")):
        out = "%s.o_blind_%s" % ("fc_dba" if who == "dba" else "fc_analyst", method)
        rows, _ = _anonymize(roles[who], out, method, sensitive="symptom", t=0.5, qis=("age", "clinic"))
        assert rows == ROWS
        assert _verify(roles[who], out, "symptom", 0.5) == 0
        assert roles[who].execute("SELECT count(DISTINCT symptom) FROM %s" % out).fetchone()[0] == 6
    rows, _ = _anonymize(analyst, "fc_analyst.o_blind_multi", "ak", sensitive=["symptom", "diag"], t=0.6,
                         qis=("age", "clinic"))
    assert rows == ROWS and _verify(analyst, "fc_analyst.o_blind_multi", ["symptom", "diag"], 0.6) == 0
    assert _collations(dba, "fc_analyst") == [] and _collations(dba, "fc_dba") == []
    _assert_clean(dba)


def test_domain_over_owner_enum_composite_and_range(roles):
    """Domains over the owner's enum (one and two levels deep, with CHECKs calling planted
    functions), over its composite and over its range: unused, they do not stop a run; used
    as QI, SA and keep columns, they are read through the base type's output function (the
    domain relabelled first), every run succeeds, verifies, and nothing of the owner runs."""
    dba, analyst, owner = roles["dba"], roles["fc_analyst"], roles["fc_owner"]
    owner.execute("CREATE TYPE fc_own.dose AS (mg integer, g fc_own.grade)")
    owner.execute("CREATE TYPE fc_own.window AS RANGE (subtype = date)")
    # (domain, base, the planted function its CHECK calls); toplevel is a domain over a domain
    for domain, base, spy in (("level", "fc_own.grade", "level_ok"), ("toplevel", "fc_own.level", None),
                              ("finding", "fc_own.diag", "finding_ok"), ("findings", "fc_own.diag[]", "findings_ok"),
                              ("dosing", "fc_own.dose", "dose_ok"), ("stay", "fc_own.window", "window_ok")):
        if spy:
            _spy(owner, spy, base, "boolean", "check " + domain, "true")
        check = " CHECK (fc_own.%s(VALUE))" % spy if spy else ""
        owner.execute("CREATE DOMAIN fc_own.%s AS %s%s" % (domain, base, check))
    for src, dst, fn in (("fc_own.level", "text", "level_text"), ("fc_own.finding", "text", "finding_text")):
        # (PostgreSQL ignores casts from a domain; planted anyway, with a warning)
        _spy(owner, fn, src, dst, "cast " + fn, "'x'")
    owner.execute("ALTER TABLE fc_own.visits ADD COLUMN lvl fc_own.level, ADD COLUMN top fc_own.toplevel, "
                  "ADD COLUMN fnd fc_own.finding, ADD COLUMN fnds fc_own.findings, ADD COLUMN dosage fc_own.dosing, "
                  "ADD COLUMN stay fc_own.stay")
    owner.execute("UPDATE fc_own.visits SET lvl = grade::text::fc_own.level, top = grade::text::fc_own.toplevel, "
                  "fnd = diag::text::fc_own.finding, fnds = ARRAY[diag, 'none']::fc_own.findings, "
                  "dosage = ROW(id, grade)::fc_own.dose, stay = fc_own.window(seen, seen + 3)")
    owner.execute("ANALYZE fc_own.visits")
    owner.execute("DELETE FROM fc_own.log")
    for who, schema in (("fc_analyst", "fc_analyst"), ("dba", "fc_dba")):
        conn = roles[who]
        # unused: the run goes on without reading them as anything but text
        assert _anonymize(conn, schema + ".o_unused", "ak")[0] == ROWS
        assert _verify(conn, schema + ".o_unused") == 0
        # used: QIs (one and two domains deep over the owner's enum), SA, keep columns
        rows, _ = conn.execute(
            "SELECT rows, classes FROM sabre_anonymize('fc_own.visits'::regclass, ARRAY['age','lvl','top'], 'fnd', "
            "0.5, 5, 'refine', %s, %s::jsonb)",
            (schema + ".o_used", json.dumps({"hierarchies": {"lvl": "fc_grade", "top": "fc_grade"},
                                             "keep": ["fnds", "dosage", "stay"]}))).fetchone()
        assert rows == ROWS
        assert _verify(conn, schema + ".o_used", "fnd", 0.5) == 0
        got = conn.execute("SELECT fnd, fnds, dosage, stay FROM %s.o_used WHERE dosage LIKE '(9,%%'" % schema
                           ).fetchone()
        src = owner.execute("SELECT pg_catalog.format('%s|%s|%s|%s', fnd, fnds, dosage, stay) FROM fc_own.visits "
                            "WHERE id = 9").fetchone()[0]      # (format: the output functions, no cast)
        assert "|".join(got) == src
        est = conn.execute("SELECT classes FROM sabre_estimate('fc_own.visits'::regclass, ARRAY['age','top'], 'fnd', "
                           "0.5::float8, 5, %s::jsonb)", (json.dumps({"hierarchies": {"top": "fc_grade"}}),)).fetchall()
        assert est
        inst = conn.execute("SELECT classes FROM sabre_instant('fc_own.visits'::regclass, ARRAY['age','lvl'], 5, "
                            "NULL, NULL, 0.0, %s, %s::jsonb)",
                            (schema + ".o_inst", json.dumps({"hierarchies": {"lvl": "fc_grade"}}))).fetchone()
        assert inst[0] >= 1
        assert _foreign_typed_columns(dba, schema) == []
    _assert_clean(dba)


def test_safe_types_rule_collations_and_domains():
    """A collation outside pg_catalog or a nondeterministic one is replaced by the default (a
    domain relabelled first); a domain over another role's type is relabelled to it before its
    output function."""
    from tests.client.fake_plpy import sabre_plpy
    S = sabre_plpy("shared.safe_types")
    plain = S.column(_row(declared="text", type="text", typname="text", category="S", recollate=True))
    assert "x".join(plain["read"]) == '(x COLLATE pg_catalog."default")' and plain["type"] == "text"
    dom = S.column(_row(type="text", typname="text", category="S", domain=True, recollate=True))
    assert "x".join(dom["read"]) == '((x)::text COLLATE pg_catalog."default")'
    assert S.column(_row(type="text", typname="text", category="S", recollate=False))["read"] is None
    enum = S.column(_row(type="owner.mood", typname="mood", category="E", trusted=False, domain=True,
                         output="pg_catalog.enum_out"))
    assert "x".join(enum["read"]) == "pg_catalog.textin(pg_catalog.enum_out((x)::owner.mood))"
    assert enum["converted"] and enum["type"] == "text"
