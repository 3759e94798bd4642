"""Plots of a replay (``companion replay … --plot out.png|out.html``), drawn with matplotlib
on its Agg backend (no display, no pyplot state).

One figure per conversation, three panels, x = turns stored:

1. the context each reply was made from, as a stacked area by source (``persona``,
   ``summary``, ``memory``, ``retrieval``, ``recent``, then the rest of the estimate:
   provider overhead and reply priming) with the reply reserve on top, against the
   context window (dashed line); compactions are vertical lines;
2. archived segments (left axis) and summary tokens (right axis) over the same turns,
   with the same compaction lines;
3. evidence recall by LoCoMo category as bars, in context and by retrieval only, with
   the number of evidence turns under each category (empty for input without QA).

``.png`` writes the figure (one file per conversation when there are several:
``stem-<conversation>.png``); ``.html`` writes one static page with every figure inlined
as a base64 PNG, so it needs no network when opened.

A public module of its own, not re-exported by :mod:`runtime.service`, so that matplotlib
is imported only when a plot is asked for.
"""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before anything draws: a file backend, no display needed

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from errors import ConfigurationError
from runtime.accounting import SOURCES
from runtime.service._replay import CATEGORIES, ReplayReport

FORMATS = (".png", ".html")
"""The file suffixes ``--plot`` takes."""

COLOURS = {
    "persona": "#7a5195",
    "summary": "#ef5675",
    "memory": "#ffa600",
    "retrieval": "#58a65c",
    "recent": "#2f7bbf",
    "other": "#b0b0b0",
    "reserve": "#555555",
}
"""One colour per source, the same as the playground's context bar."""


def check_plot_path(path: str | Path) -> Path:
    """``path`` as a plot target: a ``.png`` or ``.html`` file in an existing directory.

    Raises:
        ConfigurationError: another suffix, or a directory that does not exist (``--plot``).
    """
    target = Path(path).expanduser()
    if target.suffix.lower() not in FORMATS:
        raise ConfigurationError(
            f"--plot {str(path)!r}: give a file ending in .png or .html, not {target.suffix or 'no suffix'!r}.",
            setting="--plot",
        )
    if not target.resolve().parent.is_dir():
        raise ConfigurationError(
            f"--plot {str(path)!r}: its directory does not exist; create it first.", setting="--plot"
        )
    return target


def figure(report: ReplayReport) -> Figure:
    """The three panels of one replayed conversation (see the module docstring)."""
    fig = Figure(figsize=(12, 11), layout="constrained")
    grid = fig.add_gridspec(3, 1, height_ratios=[3, 2, 2])
    ctx = fig.add_subplot(grid[0])
    mem = fig.add_subplot(grid[1], sharex=ctx)
    bars = fig.add_subplot(grid[2])
    fig.suptitle(
        f"companion replay: {report.conversation} (window {report.window:,} tokens, {report.turns} turns, "
        f"{report.compactions} compactions, {report.overflows} overflows)",
        fontsize=12,
    )
    _context_panel(ctx, report)
    _archive_panel(mem, report)
    _recall_panel(bars, report)
    return fig


def _compaction_turns(report: ReplayReport) -> tuple[list[int], list[int]]:
    """Turns at which a compaction succeeded, and at which one failed."""
    done, failed = [], []
    before_ok = before_failed = 0
    for p in report.timeline:
        if p.compactions > before_ok:
            done.append(p.turn)
        if p.compaction_failures > before_failed:
            failed.append(p.turn)
        before_ok, before_failed = p.compactions, p.compaction_failures
    return done, failed


def _mark_compactions(ax: Axes, report: ReplayReport, *, label: bool) -> None:
    done, failed = _compaction_turns(report)
    for n, turn in enumerate(done):
        ax.axvline(turn, color="#b3261e", linewidth=0.8, alpha=0.55, label="compaction" if label and n == 0 else None)
    for n, turn in enumerate(failed):
        ax.axvline(
            turn, color="#b3261e", linewidth=1.2, linestyle=":", label="failed compaction" if label and n == 0 else None
        )


def _context_panel(ax: Axes, report: ReplayReport) -> None:
    points = [(p, p.sources) for p in report.timeline if p.sources is not None]
    ax.set_title("context of each reply, by source", loc="left", fontsize=11)
    ax.set_ylabel("tokens")
    if not points:
        ax.text(0.5, 0.5, "no replies were replayed", ha="center", va="center", transform=ax.transAxes)
        return
    turns = [p.turn for p, _ in points]
    layers = [[by_source.get(s, 0) for _, by_source in points] for s in SOURCES]
    other = [max((p.total_tokens or 0) - sum(by_source.values()), 0) for p, by_source in points]
    reserve = [p.reply_reserve for p, _ in points]
    ax.stackplot(
        turns,
        *layers,
        other,
        reserve,
        labels=[*SOURCES, "overhead and priming", "reply reserve"],
        colors=[COLOURS[s] for s in SOURCES] + [COLOURS["other"], COLOURS["reserve"]],
        alpha=0.9,
        linewidth=0,
    )
    ax.axhline(report.window, color="black", linestyle="--", linewidth=1, label=f"window ({report.window:,})")
    _mark_compactions(ax, report, label=True)
    ax.set_ylim(0, report.window * 1.25)  # the legend sits in the band above the window line
    ax.set_xlim(0, max(report.turns, 1))
    ax.legend(loc="upper left", ncols=5, fontsize=8, framealpha=0.9)


def _archive_panel(ax: Axes, report: ReplayReport) -> None:
    ax.set_title("archive and summary", loc="left", fontsize=11)
    turns = [p.turn for p in report.timeline]
    ax.step(
        turns, [p.archived_segments for p in report.timeline], where="post", color="#2f5d8a", label="archived segments"
    )
    ax.set_ylabel("archived segments", color="#2f5d8a")
    ax.set_xlabel("turns stored")
    right = ax.twinx()
    right.step(
        turns,
        [p.summary_tokens for p in report.timeline],
        where="post",
        color=COLOURS["summary"],
        label="summary tokens",
    )
    right.set_ylabel("summary tokens", color=COLOURS["summary"])
    right.set_ylim(bottom=0)
    ax.set_ylim(bottom=0)
    _mark_compactions(ax, report, label=False)
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)


def _recall_panel(ax: Axes, report: ReplayReport) -> None:
    ax.set_title("evidence recall by category", loc="left", fontsize=11)
    categories = [c for c in ("all", *CATEGORIES.values()) if report.evidence_total.get(c)]
    if not categories:
        ax.text(
            0.5,
            0.5,
            "no QA items with evidence in the input: nothing to measure",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
        ax.set_xticks([])
        ax.set_yticks([])
        return
    xs = range(len(categories))
    width = 0.38
    for offset, which, label, colour in (
        (-width / 2, "in_context", "in context", "#2f7bbf"),
        (width / 2, "retrieval", "retrieval only", "#ffa600"),
    ):
        values = [100 * (report.recall(which, c) or 0.0) for c in categories]
        drawn = ax.bar([x + offset for x in xs], values, width, label=label, color=colour)
        ax.bar_label(drawn, fmt="%.1f%%", fontsize=8, padding=2)
    ax.set_xticks(list(xs), [f"{c}\n(n={report.evidence_total[c]})" for c in categories])
    ax.set_ylabel("evidence turns found (%)")
    ax.set_ylim(0, 110)
    ax.legend(loc="upper right", fontsize=8)


def _png(report: ReplayReport) -> bytes:
    buffer = io.BytesIO()
    figure(report).savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "conversation"


def write_plot(reports: Sequence[ReplayReport], path: str | Path) -> list[Path]:
    """Write the replay plot(s) of ``reports`` to ``path`` (``.png`` or ``.html``); returns the files written.

    Raises:
        ConfigurationError: a bad ``path`` (see :func:`check_plot_path`) or no reports.
    """
    target = check_plot_path(path)
    if not reports:
        raise ConfigurationError("Nothing was replayed, so there is nothing to plot.", setting="--plot")
    if target.suffix.lower() == ".png":
        if len(reports) == 1:
            target.write_bytes(_png(reports[0]))
            return [target]
        written = []
        for report in reports:
            out = target.with_name(f"{target.stem}-{_slug(report.conversation)}.png")
            out.write_bytes(_png(report))
            written.append(out)
        return written
    sections = []
    for report in reports:
        data = base64.b64encode(_png(report)).decode("ascii")
        title = html.escape(report.conversation)
        sections.append(
            f'<section><h2>{title}</h2>\n<img alt="replay plot of {title}" src="data:image/png;base64,{data}">\n</section>'
        )
    page = (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>companion replay</title>\n'
        "<style>body{font:14px system-ui,sans-serif;margin:24px;background:#fafafa}"
        "img{max-width:100%;height:auto;background:#fff;border:1px solid #ddd}</style></head><body>\n"
        f"<h1>companion replay (window {reports[0].window:,} tokens)</h1>\n"
        + "\n".join(sections)
        + "\n</body></html>\n"
    )
    target.write_text(page, encoding="utf-8")
    return [target]
