"""The bench's report: ``results.json``, ``results.csv``, ``summary.md`` and ``fig*.png``.

:class:`Report` holds what a bench produced (the configuration, every run's record keyed by
:func:`~sabre_pg.bench.runner.run_key`, the swept figures) and writes it out;
:meth:`Report.markdown` is the text of ``summary.md``.
"""
from __future__ import annotations

import csv
import json
import platform
from pathlib import Path

from sabre_pg.bench.runner import IN_DB_PEER, LABEL, METHODS, PEER, kl_key, query_error_key, run_key
from sabre_pg.census import CENSUS_QIS, CENSUS_SENSITIVE
from sabre_pg.core.stopwatch import PHASES

CSV_HEADER = ["figure", "panel", "series", "x_name", "x", "y_name", "y"]
MARKERS = {LABEL["ak"]: "o", LABEL["knn"]: "s", LABEL[PEER]: "^", LABEL[IN_DB_PEER]: "v"}


def phase_order(names) -> list[str]:
    """Phase names in ``core.stopwatch.PHASES`` order; names it does not list follow, sorted."""
    names = set(names)
    return [phase for phase in PHASES if phase in names] + sorted(names - set(PHASES))


def _format_x(x) -> str:
    return "%dk" % (x // 1000) if isinstance(x, int) and x >= 1000 else str(x)


class Report:
    """What one bench produced; ``runs`` maps run keys to records, in the order they ran."""

    def __init__(self, cfg: dict, seed: int, runs: dict, figures: dict, peer_note: str | None,
                 total_seconds: float, server: str):
        self.cfg, self.seed, self.runs, self.figures = cfg, seed, runs, figures
        self.peer_note, self.total_seconds, self.server = peer_note, total_seconds, server

    def document(self) -> dict:
        """The content of ``results.json``: meta, every run (without its hierarchy map), figures."""
        meta = {"config": self.cfg, "seed": self.seed, "total_seconds": self.total_seconds,
                "peer": self.peer_note,
                "machine": {"python": platform.python_version(), "platform": platform.platform()},
                "server": self.server}
        runs = [{field: value for field, value in record.items() if field != "hier"}
                for record in self.runs.values()]
        return {"meta": meta, "runs": runs, "figures": self.figures}

    def csv_rows(self) -> list[list]:
        """One row per plotted point, under ``CSV_HEADER``."""
        return [[figure_id, panel["name"], series, panel["x"], x, panel["y"], y]
                for figure_id, figure in self.figures.items()
                for panel in figure["panels"]
                for series, ys in panel["series"].items()
                for x, y in zip(panel["xs"], ys)]

    def write(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(self.document(), indent=1, default=float) + "\n")
        with open(out / "results.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(CSV_HEADER)
            writer.writerows(self.csv_rows())
        plot(self.figures, out)
        (out / "summary.md").write_text(self.markdown())

    # ------------------------------------------------------------------ summary.md
    def markdown(self) -> str:
        """``summary.md``: the default configuration, its phases, the peer comparison, the figures."""
        cfg = self.cfg
        lines = ["# sabre-pg bench", "",
                 "Census-like data (seed %d); defaults n = %d, k = %d, t = %g, %d QIs (%s), SA %s. "
                 "Total %.1f s." % (self.seed, cfg["rows"], cfg["k"], cfg["t"], cfg["qis"],
                                    ", ".join(CENSUS_QIS[:cfg["qis"]]), CENSUS_SENSITIVE,
                                    self.total_seconds), ""]
        lines += self._default_table() + [""] + [self._phase_line(), ""]
        lines += ["## Peer comparison (salary as categorical SA, flat hierarchy = equal-distance EMD)", ""]
        if self.peer_note:
            lines += [self.peer_note, ""]
        lines += self._peer_table()
        lines += ["", "## Figures", ""]
        lines += ["* `%s.png`: %s" % (figure_id, figure["title"]) for figure_id, figure in self.figures.items()]
        return "\n".join(lines) + "\n"

    def _default_run(self, method: str) -> dict:
        return self.runs[run_key(self.cfg, method)]

    def _default_table(self) -> list[str]:
        cfg = self.cfg
        lines = ["## Default configuration (numerical SA, ordered EMD)", "",
                 "| method | AIL | real closeness | classes | violations | time (s) | median rel. error "
                 "(lambda=%d, theta=%g) | KL (level %d) |" % (cfg["lam"], cfg["theta"], cfg["level"]),
                 "|---|---|---|---|---|---|---|---|"]
        for method in METHODS:
            record = self._default_run(method)
            query_error = record["query_error"].get(query_error_key(cfg), {}).get("median")
            kl = record["kl"].get(kl_key(cfg))
            lines.append("| %s | %.4f | %.4f | %d | %d | %.2f | %s | %s |" % (
                LABEL[method], record["ail"], record["closeness"], record["classes"],
                record["violations"], record["seconds"],
                "-" if query_error is None else "%.4f" % query_error, "-" if kl is None else "%.4f" % kl))
        return lines

    def _phase_line(self) -> str:
        """Seconds per phase of the default runs, in ``PHASES`` order."""
        def phases(method):
            recorded = self._default_run(method)["phases"]
            return ", ".join("%s %.3f" % (phase, recorded[phase]) for phase in phase_order(recorded))
        return "Time per phase (s): " + "; ".join(
            "%s: %s" % (LABEL[method], phases(method)) for method in METHODS)

    def _peer_table(self) -> list[str]:
        lines = ["| t | method | AIL | real closeness | classes | sabre_verify violations | time (s) |",
                 "|---|---|---|---|---|---|---|"]
        for t in self.cfg["peer_t"]:
            for method in list(METHODS) + [IN_DB_PEER, PEER]:
                record = self.runs.get(run_key(self.cfg, method, t=t, sa_flat=True))
                if record is not None:
                    lines.append("| %g | %s | %.4f | %.4f | %d | %d | %.2f |" % (
                        t, LABEL[method], record["ail"], record["closeness"], record["classes"],
                        record["violations"], record["seconds"]))
        return lines


def _draw_stacked(axis, panel: dict, colors) -> None:
    positions = list(range(len(panel["xs"])))
    bottom = [0.0] * len(positions)
    for index, (series, ys) in enumerate(panel["series"].items()):
        if not any(ys):
            continue
        axis.bar(positions, ys, bottom=bottom, label=series, width=0.6, color=colors[index % len(colors)])
        bottom = [b + y for b, y in zip(bottom, ys)]
    axis.set_xticks(positions, [_format_x(x) for x in panel["xs"]])
    axis.legend(fontsize=6, ncol=2)


def _draw_lines(axis, panel: dict) -> None:
    for series, ys in panel["series"].items():
        axis.plot(panel["xs"], ys, marker=MARKERS.get(series, "o"), label=series)
    axis.legend(fontsize=7)


def plot(figures: dict, out: Path) -> None:
    """``<figure id>.png`` per figure: a grid of its panels (stacked bars for phase panels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab20").colors
    for figure_id, figure in figures.items():
        panels = figure["panels"]
        columns = min(len(panels), 2 if len(panels) == 4 else 3)
        rows = -(-len(panels) // columns)
        canvas, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.6 * rows), squeeze=False)
        for axis in axes.ravel()[len(panels):]:
            axis.set_visible(False)
        for axis, panel in zip(axes.ravel(), panels):
            if panel.get("stacked"):
                _draw_stacked(axis, panel, colors)
            else:
                _draw_lines(axis, panel)
            axis.set_title(panel["name"], fontsize=9)
            axis.set_xlabel(panel["x"])
            axis.set_ylabel(panel["y"])
            axis.grid(alpha=0.3)
        canvas.suptitle(figure["title"], fontsize=9)
        canvas.tight_layout()
        canvas.savefig(out / f"{figure_id}.png", dpi=110)
        plt.close(canvas)
