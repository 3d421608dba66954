"""Caps on what one call may make the server do (docs/security.md, "Caps").

Every loop whose length a caller chooses is bounded here, in one place: the PL/Python entry
points check their arguments against these numbers before any work and raise a clear error
(SQLSTATE 54000 program_limit_exceeded, with a HINT); the catalog's SQL reads the run-token
caps through the installer (``@limit:NAME@`` in sql/*.sql).  The numbers are generous for
real use -- the largest real hierarchies (ICD-10-CM, about 72,000 codes on 5 levels; US ZIP
codes, about 42,000 on 4) are well inside -- and keep a call within about a second of
server time and a few hundred MB at worst.  Pure: no database import.
"""
from __future__ import annotations

# ---- hierarchies (sabre_define_hierarchy, and any hierarchy a run loads from the catalog)
HIERARCHY_TEXT_BYTES = 4 * 1024 * 1024    # the ARX text, UTF-8 bytes
HIERARCHY_LEAVES = 100_000                # rows (one per leaf)
HIERARCHY_HEIGHT = 32                     # levels above the leaves (33 columns per row)
HIERARCHY_CELLS = 500_000                 # leaves x (height + 1): the labels parsed and stored
HIERARCHY_CALL_CELLS = 1_000_000         # the labels of every attribute's hierarchy in one call, summed per attribute

# ---- parameter arrays
ESTIMATE_T_VALUES = 100                   # t values in one sabre_estimate call
SENSITIVE_ATTRIBUTES = 32                 # sensitive attributes (and their t) in one several-SA call
QUASI_IDENTIFIERS = 256                   # quasi-identifiers in one call
WORKLOAD_QUERIES = 1_000_000              # queries of sabre_query_error(_stats)
KL_CUBOIDS = 10_000                       # cuboids of sabre_kl_cuboids / sabre_kl_divergence
PARTS = 4096                              # options.partitions, and the parts sabre_publish_parts takes
# a plain run over more rows is split into parts of at most this many (options.auto_partition_rows,
# docs/scale-out.md "Automatic partitions"): the default keeps a backend near 1.3 GB at its peak
# (about 600 bytes per row of the largest part, measured at 1M rows), under a 2 GiB budget
AUTO_PARTITION_ROWS = 2_000_000
WORKLOAD_MAX_CELLS = 64_000_000           # options.max_cells of the utility measures (default 8,000,000)
WORKLOAD_MAX_BINS = 65_536                # options.max_bins of the utility measures (default 1,024)

# ---- sabre_instant (issue 25, finding 5; docs/instant.md, "Bounds")
INSTANT_LATTICE_NODES = 100_000           # nodes of the lattice (product of the QIs' level counts), checked before any is made
INSTANT_NODE_BUCKETS = 1 << 24            # buckets of one lattice node evaluated (a node with more is pruned)

# ---- run tokens (sql/10_catalog.sql: run_begin, run_record)
RUN_TOKENS_PER_TRANSACTION = 100          # tokens outstanding in one transaction (a run uses one)
RUN_TOKEN_TTL_SECONDS = 24 * 3600         # a token older than this is refused and deleted


class LimitExceeded(ValueError):
    """A cap of this module exceeded (the entry points raise it as SQLSTATE 54000)."""


def over(what: str, value: int, cap: int) -> str | None:
    """The message when ``value`` exceeds ``cap`` (None when within): one wording everywhere."""
    if value <= cap:
        return None
    return "%s: %s, more than the cap of %s" % (what, _n(value), _n(cap))


def check(what: str, value: int, cap: int) -> None:
    """Raise :class:`LimitExceeded` when ``value`` exceeds ``cap``."""
    message = over(what, value, cap)
    if message:
        raise LimitExceeded(message)


def _n(x: int) -> str:
    return "{:,}".format(int(x))
