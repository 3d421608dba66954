"""Finding 9 of issue #25: the recommended ``search_path`` cannot be captured.

PostgreSQL takes a function of identical argument types from the first schema on the path, but
weighs overloads of *different* argument types equally wherever they stand.  So a role with
``CREATE`` on any schema of another role's path can plant a better-matching overload of a sabre
function and have it run as that role.  docs/security.md recommends schema-qualified calls or a
path of schemas no other role can write (``"$user", sabre``); these tests plant such overloads
(several argument shapes) and assert what the docs say: they capture unqualified calls under the
old recommendation (``public, sabre``) and with ``public`` anywhere on the path, never under the
new one nor with a qualified call.
"""
from __future__ import annotations

import psycopg
import pytest

ATTACKER, VICTIM = "sp_eve", "sp_carol"
SOURCE_ROWS = 600

# (planted signature, call with literals as a user types them)
PLANTS = [
    # 0.3 is numeric: matches numeric exactly, sabre's double precision only by an implicit cast
    ("sabre_verify(output text, sensitive text, t numeric, k integer)",
     "sabre_verify('carol.people_sabre', 'salary', 0.3, 5)"),
    # the first argument typed as unknown literal: text beats regclass for an unknown literal
    ("sabre_verify(output text, sensitive text, t numeric)",
     "sabre_verify('carol.people_sabre', 'salary', 0.3)"),
    # a same-signature plant (double precision, integer) written as such: first on the path wins
    ("sabre_verify(output regclass, sensitive text, t double precision, k integer DEFAULT 1, "
     "hierarchy text DEFAULT NULL, l integer DEFAULT NULL)",
     "sabre_verify('carol.people_sabre'::regclass, 'salary', 0.3::float8, 5)"),
]


@pytest.fixture
def world(pg_conn, pg_connect):
    for r in (ATTACKER, VICTIM):
        pg_conn.execute(f"DROP ROLE IF EXISTS {r}")
        pg_conn.execute(f"CREATE ROLE {r} LOGIN")
        pg_conn.execute(f"GRANT USAGE ON SCHEMA sabre TO {r}")
    pg_conn.execute(f"CREATE SCHEMA carol AUTHORIZATION {VICTIM}")
    pg_conn.execute(f"CREATE SCHEMA eve AUTHORIZATION {ATTACKER}")
    pg_conn.execute(f"GRANT CREATE ON SCHEMA public TO {ATTACKER}")
    eve, carol = pg_connect(user=ATTACKER), pg_connect(user=VICTIM)
    eve.execute("CREATE TABLE eve.caught (who name, how text)")
    eve.execute("GRANT USAGE ON SCHEMA eve TO PUBLIC")
    eve.execute("GRANT INSERT ON eve.caught TO PUBLIC")
    carol.execute(f"CREATE TABLE carol.people AS SELECT g AS id, 20 + g % 40 AS age, g % 9 AS salary "
                  f"FROM pg_catalog.generate_series(1, {SOURCE_ROWS}) g")
    carol.execute("ALTER TABLE carol.people ADD PRIMARY KEY (id)")
    carol.execute("SELECT * FROM sabre.sabre_anonymize('carol.people'::regclass, ARRAY['age'], 'salary', 0.3, 5)")
    yield pg_conn, eve, carol
    eve.close()
    carol.close()
    for schema in ("carol", "eve"):
        pg_conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    for r in (ATTACKER, VICTIM):
        pg_conn.execute(f"DROP OWNED BY {r}")
        pg_conn.execute(f"DROP ROLE {r}")


def _plant(eve, signature: str) -> None:
    returns = ("TABLE(classes bigint, rows bigint, min_class_size bigint, max_emd double precision, "
               "violations bigint)")
    eve.execute(f"CREATE FUNCTION public.{signature} RETURNS {returns} LANGUAGE sql AS "
                f"$$ INSERT INTO eve.caught VALUES (current_user, 'captured'); "
                f"SELECT 0::bigint, 0::bigint, 0::bigint, 0::float8, 0::bigint $$")
    eve.execute(f"GRANT EXECUTE ON FUNCTION public.{signature.split('(')[0]} TO PUBLIC")


def _caught(dba) -> list:
    return dba.execute("SELECT who FROM eve.caught").fetchall()


def _call(carol, path: str, call: str) -> None:
    carol.execute(f"SET search_path = {path}")
    try:
        carol.execute(f"SELECT * FROM {call}").fetchall()
    except psycopg.errors.AmbiguousFunction:
        pass  # two equally good candidates: PostgreSQL refuses, and nothing of the attacker's ran


@pytest.mark.parametrize("signature,call", PLANTS, ids=["numeric-t", "text-output", "same-signature"])
def test_recommended_path_and_qualified_calls_are_not_captured(world, signature, call):
    dba, eve, carol = world
    _plant(eve, signature)
    _call(carol, '"$user", sabre', call)
    assert _caught(dba) == []
    _call(carol, "public, sabre", "sabre." + call)
    assert _caught(dba) == []


def test_a_writable_schema_anywhere_on_the_path_captures_what_the_docs_warn_about(world):
    """Why the docs recommend what they do: the old path, and public after sabre, are captured."""
    dba, eve, carol = world
    _plant(eve, PLANTS[0][0])
    _call(carol, "public, sabre", PLANTS[0][1])
    assert _caught(dba) == [(VICTIM,)]
    dba.execute("TRUNCATE eve.caught")
    _call(carol, '"$user", sabre, public', PLANTS[0][1])
    assert _caught(dba) == [(VICTIM,)]


def test_readme_and_security_page_recommend_the_uncapturable_path():
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    for page in (root / "README.md", root / "docs" / "security.md"):
        text = page.read_text()
        assert 'ALTER ROLE analyst SET search_path = "$user", sabre;' in text, page
        assert "SET search_path = public, sabre" not in text, page
