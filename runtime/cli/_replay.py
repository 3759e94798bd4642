"""``companion replay``: feed a stored conversation through the engine and print what happened."""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

from runtime.cli._common import EXIT_USAGE, _check_window, _settings


def cmd_replay(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from memory.embeddings import runtime_embedder

    started = time.perf_counter()
    if args.report:
        report_dir = Path(args.report).expanduser().resolve().parent
        if not report_dir.is_dir():
            print(f"error: the directory of --report {args.report!r} does not exist; create it first.", file=sys.stderr)
            return EXIT_USAGE
    if args.plot:
        from runtime.service.replay_plot import check_plot_path

        check_plot_path(args.plot)  # a bad --plot fails before the replay runs
    _check_window(args.window)
    settings = _settings(database=True)
    # the model loads (its runtime, the weights) while the runtime's own modules import and the
    # database opens; open_engine's open_embedder, without the import wait
    api = "/" in settings.embedding_model and not Path(settings.embedding_model).expanduser().exists()
    embedder = (
        None  # perhaps an embeddings API: open_engine decides, once litellm is imported
        if api
        else runtime_embedder(
            settings.embedding_model,
            threads=settings.embed_threads,
            preload=True,
            backend=settings.embed_backend,
            cache_dir=settings.model_cache_dir,
        )
    )
    from runtime.service import load_conversations, open_engine, replay_conversation

    console = Console(stderr=False, width=max(Console().width, 160))
    conversations = load_conversations(Path(args.path), args.conversation)
    engine = open_engine(settings, with_model=False, embedder=embedder)  # replies come from the file
    if args.window is not None:
        engine = engine.derive(window=args.window)
    reports = []
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    ) as progress:
        for conv in conversations:
            task = progress.add_task(f"replay {conv.id}", total=len(conv.turns))
            reports.append(replay_conversation(engine, conv, on_turn=functools.partial(progress.advance, task)))

    console.print(_replay_tables(reports, title=f"companion replay {args.path} (window {engine.window} tokens)"))
    total = time.perf_counter() - started
    console.print(
        f"total wall time {total:.1f} s; sessions are kept in the database (e.g. {reports[0].session_id if reports else '-'})."
    )
    if args.report:
        Path(args.report).write_text(
            json.dumps(
                {"window": engine.window, "wall_seconds": total, "conversations": [r.as_dict() for r in reports]},
                indent=2,
                default=str,
            ),
            encoding="utf-8",
        )
    if args.plot:
        from runtime.service.replay_plot import write_plot

        for written in write_plot(reports, args.plot):
            console.print(f"plot written to {written}")
    return 1 if any(r.overflows for r in reports) else 0


def _pct(found: int, total: int) -> str:
    return f"{100 * found / total:.1f}%" if total else "-"


def _replay_tables(reports, *, title: str):
    """Two tables: one row per conversation (plus a total row) for the run's figures,
    and evidence recall by LoCoMo category."""
    from rich.console import Group
    from rich.table import Table

    from runtime.service import CATEGORIES

    main = Table(title=title)
    for col in (
        "conversation",
        "turns",
        "sessions",
        "compactions",
        "segments",
        "summary tok",
        "largest / window",
        "overflows",
        "user turns kept",
        "recall ctx",
        "recall ret",
        "prefix share",
        "wall s",
    ):
        main.add_column(col, justify="left" if col == "conversation" else "right")
    sums = {k: 0 for k in ("turns", "sessions", "compactions", "archived_segments", "overflows", "users", "kept")}
    ev_total = ev_ctx = ev_ret = 0
    for r in reports:
        users, kept = r.user_turns, r.user_turns_recoverable
        main.add_row(
            r.conversation,
            str(r.turns),
            str(r.sessions),
            str(r.compactions),
            str(r.archived_segments),
            str(r.summary_tokens),
            f"{r.largest_context} / {r.window}",
            str(r.overflows),
            f"{kept}/{users}" if users else "-",
            _pct(r.evidence_in_context.get("all", 0), r.evidence_total.get("all", 0)),
            _pct(r.evidence_retrieval.get("all", 0), r.evidence_total.get("all", 0)),
            _pct(r.shared_tokens, r.prompt_tokens),
            f"{r.wall_seconds:.1f}",
        )
        for key, value in (
            ("turns", r.turns),
            ("sessions", r.sessions),
            ("compactions", r.compactions),
            ("archived_segments", r.archived_segments),
            ("overflows", r.overflows),
            ("users", users),
            ("kept", kept),
        ):
            sums[key] += value
        ev_total += r.evidence_total.get("all", 0)
        ev_ctx += r.evidence_in_context.get("all", 0)
        ev_ret += r.evidence_retrieval.get("all", 0)
    if len(reports) > 1:
        main.add_row(
            "all",
            str(sums["turns"]),
            str(sums["sessions"]),
            str(sums["compactions"]),
            str(sums["archived_segments"]),
            "",
            f"{max(r.largest_context for r in reports)} / {reports[0].window}",
            str(sums["overflows"]),
            f"{sums['kept']}/{sums['users']}" if sums["users"] else "-",
            _pct(ev_ctx, ev_total),
            _pct(ev_ret, ev_total),
            _pct(sum(r.shared_tokens for r in reports), sum(r.prompt_tokens for r in reports)),
            f"{sum(r.wall_seconds for r in reports):.1f}",
        )
    by_cat = Table(title="evidence recall by category: in context / retrieval only (evidence turns)")
    by_cat.add_column("conversation")
    for name in CATEGORIES.values():
        by_cat.add_column(name, justify="right")
    totals = {name: [0, 0, 0] for name in CATEGORIES.values()}
    for r in reports:
        cells = []
        for name in CATEGORIES.values():
            n, c, t = (
                r.evidence_total.get(name, 0),
                r.evidence_in_context.get(name, 0),
                r.evidence_retrieval.get(name, 0),
            )
            totals[name] = [totals[name][0] + n, totals[name][1] + c, totals[name][2] + t]
            cells.append(f"{_pct(c, n)} / {_pct(t, n)} ({n})" if n else "-")
        by_cat.add_row(r.conversation, *cells)
    if len(reports) > 1:
        by_cat.add_row("all", *[f"{_pct(c, n)} / {_pct(t, n)} ({n})" if n else "-" for n, c, t in totals.values()])
    return Group(main, by_cat)
