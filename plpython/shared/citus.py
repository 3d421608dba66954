"""Outputs of a run on a Citus distributed source (docs/scale-out.md, "Citus (built so far)").

When the source is a hash-distributed Citus table, the relations a run built (under their
temporary names, after the pre-swap check and before the swap) are made Citus tables, in the
run's transaction (Citus's distributed transaction: all or nothing across the nodes):

- ``<output>``: distributed, colocated with the source by its distribution column when that column
  is published (``options.keep``); otherwise distributed by ``ec_id`` (Citus's default colocation
  for its type), and a NOTICE says how to colocate;
- ``<output>_classes``: a reference table (one row per class, a copy on every node);
- ``<output>_keys``: distributed by ``key``.

A source that is not a Citus table, or a reference or local Citus table, keeps plain outputs.
This is the path of calls the push-down does not take (``batch/citus_shards.py`` anonymizes
each shard on its worker and creates its relations distributed itself; see the docs).
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext

from . import common as C
from . import errors as E

NODE_DOWN_HINT = ("Nothing was published: the previous output, if any, is intact on every node. Start the node "
                  "again (or remove it from the cluster), then run again.")


# a node that went away: a connection failure (class 08), or a worker shut down or restarting
# while it served the run (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now)
NODE_DOWN_STATES = ("08", "57P01", "57P02", "57P03")


@contextmanager
def node_failures(plpy):
    """A statement of the run that lost a node of the cluster (:data:`NODE_DOWN_STATES`: Citus
    reaching a worker that is down, or a worker stopped while it anonymized a shard) becomes
    sabre's error 08006 with a HINT; the run's transaction rolls back."""
    try:
        yield
    except plpy.SPIError as e:
        state = getattr(e, "sqlstate", None) or ""
        if not state.startswith(NODE_DOWN_STATES):
            raise
        where = " (%s)" % e.context.splitlines()[-1] if "executing command on" in (getattr(e, "context", None)
                                                                                  or "") else ""
        raise E.connection_failure("sabre_anonymize could not reach a node of the cluster: %s%s"
                                   % (str(e).splitlines()[0] if str(e) else state, where), NODE_DOWN_HINT) from e


def reads_without_worker_transactions(plpy, distributed: bool):
    """Around the reads of a call on a distributed relation that is not driven (shared/driven.py):
    its SELECTs open no transaction on the workers (``citus.select_opens_transaction_block``
    off).  Each statement PL/Python runs opens a subtransaction, which sends SAVEPOINT to every
    worker holding a transaction of the call, and a worker lost between two statements would
    fail that SAVEPOINT outside PL/Python's error handling (docs/scale-out.md, "A worker lost
    mid-run"); with no worker transaction, the next statement needing the worker fails as any
    statement does.  A read needs no transaction of its own on the workers; a write (the
    output's distribution) opens one as before."""
    if not distributed:
        return nullcontext()
    return C.settings(plpy, **{"citus.select_opens_transaction_block": "off"})


_DISTRIBUTION_SQL = (
    "SELECT p.partmethod::pg_catalog.text AS method, pg_catalog.column_to_column_name(p.logicalrelid, p.partkey) AS col "
    "FROM pg_catalog.pg_dist_partition p WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1")


def _has_citus(plpy) -> bool:
    return len(plpy.execute("SELECT 1 FROM pg_catalog.pg_extension "
                            "WHERE extname OPERATOR(pg_catalog.=) 'citus'")) > 0


def distribution_column(plpy, source_oid: int) -> str | None:
    """The distribution column of a hash-distributed Citus table; None for anything else."""
    if not _has_citus(plpy):
        return None
    rows = plpy.execute(C.prepared(plpy, _DISTRIBUTION_SQL, ["oid"]), [source_oid])
    if not len(rows) or rows[0]["method"] != "h":
        return None
    return rows[0]["col"]


def _citus_table(plpy, relation: str) -> bool:
    return len(plpy.execute(C.prepared(plpy, "SELECT 1 FROM pg_catalog.pg_dist_partition p WHERE p.logicalrelid "
                                       "OPERATOR(pg_catalog.=) $1::pg_catalog.regclass", ["text"]), [relation])) > 0


def distribute_outputs(plpy, req, built: dict) -> None:
    """Make the relations ``built`` ({suffix: temporary qualified name}) Citus tables when the
    source is hash-distributed (see the module docstring); otherwise do nothing."""
    column = distribution_column(plpy, req.source["oid"])
    if column is None:
        return
    if _citus_table(plpy, built[""]):        # a pushed-down run made them distributed (batch/citus_shards.py)
        return
    with C.quietly(plpy):  # Citus's NOTICEs on copying the local rows into the shards
        if "_classes" in built:
            plpy.execute(C.prepared(plpy, "SELECT pg_catalog.create_reference_table($1::pg_catalog.regclass)",
                                    ["text"]), [built["_classes"]])
        if "_keys" in built:
            plpy.execute(C.prepared(plpy, "SELECT pg_catalog.create_distributed_table("
                                    "$1::pg_catalog.regclass, 'key', colocate_with => 'default')", ["text"]),
                         [built["_keys"]])
        if column in req.options.keep:
            plpy.execute(C.prepared(plpy, "SELECT pg_catalog.create_distributed_table($1::pg_catalog.regclass, $2, "
                                    "colocate_with => $3)", ["text", "text", "text"]),
                         [built[""], column, req.source["qname"]])
            return
        plpy.execute(C.prepared(plpy, "SELECT pg_catalog.create_distributed_table($1::pg_catalog.regclass, "
                                "'ec_id', colocate_with => 'default')", ["text"]), [built[""]])
    plpy.notice("sabre: output %s is distributed by ec_id, not colocated with %s: its distribution column %s "
                "is not published" % (req.output.qualified(), req.source["qname"], column),
                hint='Pass options => \'{"keep": ["%s"]}\' to publish it and colocate the output with the source.'
                % column.replace('"', '\\"'))


def refuse_distributed(plpy, relation: dict, entry: str, why: str, hint: str) -> None:
    """0A000 when ``relation`` (common.resolve_relation) is a hash-distributed Citus table:
    ``entry`` does not run on one (docs/scale-out.md says which entry points do)."""
    if distribution_column(plpy, relation["oid"]) is not None:
        raise E.feature_not_supported("%s does not run on %s: it is a Citus distributed table (%s)"
                                      % (entry, relation["qname"], why), hint)
