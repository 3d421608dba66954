"""The experiments of SABRE §6 as data: a table of figure specs and one sweep function.

A :class:`Figure` (figs 10–13, 17, 18 and the peer comparison) is a title and a tuple of
:class:`Panel` specs.  A panel plots one measure against one swept value ``x`` taken from
the configuration (``xs``): ``x`` either changes the run (``vary``: ``t``, ``qis``, ``rows``
or ``k``; the other parameters keep their defaults) or the measure (``measure_arg``: the
query workload's ``lam`` or ``theta``, the datacube's ``level``) of the default run.
:func:`sweep` turns one spec into the figure's series with any runner that has
``anonymize``, ``query_error`` and ``kl`` (:class:`sabre_pg.bench.runner.Runner`, or
:class:`Plan`, which only counts the steps).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sabre_pg.bench.report import phase_order
from sabre_pg.bench.runner import IN_DB_PEER, LABEL, METHODS, PEER, kl_key, query_error_key, run_key

DEFAULT = dict(rows=100_000, k=6, t=0.35, qis=7, queries=10_000, lam=3, theta=0.1, level=2,
               t_values=[0.15, 0.25, 0.35, 0.45, 0.55], qi_counts=[3, 4, 5, 6, 7],
               sizes=[100_000, 250_000, 500_000], k_values=[2, 6, 10, 20],
               lambdas=[1, 2, 3], thetas=[0.05, 0.1, 0.15, 0.2], levels=[1, 2, 3],
               peer_t=[0.15, 0.25, 0.35, 0.45, 0.55])
QUICK = dict(rows=5_000, k=6, t=0.35, qis=7, queries=1_000, lam=3, theta=0.1, level=2,
             t_values=[0.25, 0.45], qi_counts=[3, 7], sizes=[5_000, 10_000], k_values=[6, 12],
             lambdas=[1, 3], thetas=[0.1, 0.2], levels=[1, 2], peer_t=[0.25, 0.45])

RUN_PARAMETERS = ("rows", "t", "k", "qis")
#: measures computed by the runner; every other measure is a field of the run's record
#: (``ail``, ``seconds``, ``closeness``, ``classes``, ``aecs_normalized``, ``violations``)
RUNNER_MEASURES = {"query_error": ("lam", "theta"), "kl": ("level",)}
PHASES_MEASURE = "phases"


@dataclass(frozen=True)
class Panel:
    """One plot: ``measure`` against ``x`` in ``cfg[xs]``, one series per method.

    ``name`` is %-formatted with the configuration (and ``method``, the method's label, for
    the ``phases`` measure, which gives one stacked panel per method)."""
    name: str
    x: str
    xs: str
    y: str
    measure: str
    vary: str | None = None
    measure_arg: str | None = None

    def __post_init__(self):
        if (self.vary is None) == (self.measure_arg is None):
            raise ValueError(f"panel {self.name!r}: x must set either the run (vary) or the measure")
        if self.vary is not None and self.vary not in RUN_PARAMETERS:
            raise ValueError(f"panel {self.name!r}: vary must be one of {RUN_PARAMETERS}")
        if self.measure_arg is not None and self.measure_arg not in RUNNER_MEASURES.get(self.measure, ()):
            raise ValueError(f"panel {self.name!r}: {self.measure} has no argument {self.measure_arg!r}")


@dataclass(frozen=True)
class Figure:
    """A figure: ``title`` (%-formatted with the configuration) and its panels; ``sa_flat``
    runs salary as a categorical SA under a flat hierarchy, ``with_peer`` adds Mondrian."""
    id: str
    title: str
    panels: tuple[Panel, ...]
    sa_flat: bool = False
    with_peer: bool = False


FIGURES: tuple[Figure, ...] = (
    Figure("fig10", "Effect of t (n=%(rows)d, k=%(k)d, %(qis)d QIs, numerical SA)", (
        Panel("AIL vs t", "t", "t_values", "AIL", "ail", vary="t"),
        Panel("time vs t", "t", "t_values", "seconds", "seconds", vary="t"),
        Panel("real closeness vs t", "t", "t_values", "max EMD", "closeness", vary="t"),
        Panel("classes vs t", "t", "t_values", "classes", "classes", vary="t"),
    )),
    Figure("fig11", "Effect of the number of QIs (n=%(rows)d, t=%(t)g, k=%(k)d)", (
        Panel("AIL vs QIs", "QIs", "qi_counts", "AIL", "ail", vary="qis"),
        Panel("time vs QIs", "QIs", "qi_counts", "seconds", "seconds", vary="qis"),
        Panel("real closeness vs QIs", "QIs", "qi_counts", "max EMD", "closeness", vary="qis"),
    )),
    Figure("fig12", "Scalability (t=%(t)g, k=%(k)d, %(qis)d QIs)", (
        Panel("time vs n", "n", "sizes", "seconds", "seconds", vary="rows"),
        Panel("AIL vs n", "n", "sizes", "AIL", "ail", vary="rows"),
        Panel("%(method)s phases vs n", "n", "sizes", "seconds", PHASES_MEASURE, vary="rows"),
    )),
    Figure("fig13", "Effect of k (n=%(rows)d, t=%(t)g, %(qis)d QIs)", (
        Panel("AIL vs k", "k", "k_values", "AIL", "ail", vary="k"),
        Panel("time vs k", "k", "k_values", "seconds", "seconds", vary="k"),
        Panel("normalized AECS vs k", "k", "k_values", "n / (C k)", "aecs_normalized", vary="k"),
    )),
    Figure("fig17", "Median relative error of COUNT queries (n=%(rows)d, k=%(k)d, %(queries)d queries)", (
        Panel("vs lambda (theta=%(theta)g, t=%(t)g)", "lambda", "lambdas", "median relative error",
              "query_error", measure_arg="lam"),
        Panel("vs theta (lambda=%(lam)d, t=%(t)g)", "theta", "thetas", "median relative error",
              "query_error", measure_arg="theta"),
        Panel("vs t (lambda=%(lam)d, theta=%(theta)g)", "t", "t_values", "median relative error",
              "query_error", vary="t"),
    )),
    Figure("fig18", "KL-divergence of the datacube (n=%(rows)d, k=%(k)d)", (
        Panel("vs level (t=%(t)g)", "level mu", "levels", "KL (nats)", "kl", measure_arg="level"),
        Panel("vs t (level %(level)d)", "t", "t_values", "KL (nats)", "kl", vary="t"),
        Panel("vs QIs (level %(level)d)", "QIs", "qi_counts", "KL (nats)", "kl", vary="qis"),
    )),
    Figure("fig_peer", "SABRE vs Mondrian t-closeness, salary as categorical SA with a flat hierarchy "
           "(equal-distance EMD; n=%(rows)d, k=%(k)d, %(qis)d QIs)", (
        Panel("AIL vs t", "t", "peer_t", "AIL", "ail", vary="t"),
        Panel("time vs t", "t", "peer_t", "seconds", "seconds", vary="t"),
        Panel("real closeness vs t", "t", "peer_t", "max EMD", "closeness", vary="t"),
        Panel("t-closeness / k violations (sabre_verify)", "t", "peer_t", "violating classes",
              "violations", vary="t"),
    ), sa_flat=True, with_peer=True),
)


def figure_methods(figure: Figure, use_peer: bool) -> list[str]:
    """SABRE-AK and -KNN; in the peer figure also the in-database t-Mondrian and, if usable,
    anonypyx."""
    peers = [IN_DB_PEER] + ([PEER] if use_peer else []) if figure.with_peer else []
    return list(METHODS) + peers


def _record(runner, figure: Figure, panel: Panel, method: str, x) -> dict:
    """The run a point of ``panel`` measures: x sets ``panel.vary``, or it is the default run."""
    parameters = {panel.vary: x} if panel.vary else {}
    return runner.anonymize(method, sa_flat=figure.sa_flat, **parameters)


def _value(runner, record: dict, panel: Panel, x):
    if panel.measure in RUNNER_MEASURES:
        arguments = {panel.measure_arg: x} if panel.measure_arg else {}
        return getattr(runner, panel.measure)(record, **arguments)
    return record[panel.measure]


def _phase_panels(runner, figure: Figure, panel: Panel, cfg: dict, methods: list[str]) -> list[dict]:
    """One stacked panel per method: seconds per phase (``PHASES`` order) against x."""
    xs = cfg[panel.xs]
    records = {(method, x): _record(runner, figure, panel, method, x) for method in methods for x in xs}
    seen = set().union(*(record["phases"] for record in records.values())) - {"total"}
    return [{"name": panel.name % {**cfg, "method": LABEL[method]}, "x": panel.x, "xs": xs,
             "y": panel.y, "stacked": True,
             "series": {phase: [float(records[method, x]["phases"].get(phase, 0.0)) for x in xs]
                        for phase in phase_order(seen)}}
            for method in methods]


def sweep(runner, figure: Figure, cfg: dict, use_peer: bool) -> dict:
    """``{"title", "panels"}`` of one figure; each panel ``{"name", "x", "xs", "y", "series":
    {method label: [y per x]}}`` (``"stacked": True`` for phase panels)."""
    methods = figure_methods(figure, use_peer)
    panels = []
    for panel in figure.panels:
        if panel.measure == PHASES_MEASURE:
            panels += _phase_panels(runner, figure, panel, cfg, methods)
            continue
        xs = cfg[panel.xs]
        panels.append({"name": panel.name % cfg, "x": panel.x, "xs": xs, "y": panel.y, "series": {
            LABEL[method]: [_value(runner, _record(runner, figure, panel, method, x), panel, x) for x in xs]
            for method in methods}})
    return {"title": figure.title % cfg, "panels": panels}


class Plan:
    """A stand-in runner that only notes which runs and measures the sweeps ask for."""

    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.runs: dict[tuple, dict] = {}
        self.measures: set[tuple] = set()

    def anonymize(self, method: str, sa_flat: bool = False, **parameters) -> dict:
        key = run_key(self.cfg, method, sa_flat=sa_flat, **parameters)
        return self.runs.setdefault(key, defaultdict(float, key=key, phases={}))

    def query_error(self, record, **arguments) -> float:
        self.measures.add((record["key"], query_error_key(self.cfg, **arguments)))
        return 0.0

    def kl(self, record, **arguments) -> float:
        self.measures.add((record["key"], kl_key(self.cfg, **arguments)))
        return 0.0


def planned_steps(cfg: dict, use_peer: bool, figures: tuple[Figure, ...] = FIGURES) -> int:
    """How many runs and measures the figures need (each is done once): the progress total."""
    plan = Plan(cfg)
    for figure in figures:
        sweep(plan, figure, cfg, use_peer)
    return len(plan.runs) + len(plan.measures)
