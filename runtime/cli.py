"""The ``companion`` command line.

::

    companion replay PATH [--conversation ID] [--window TOKENS] [--report FILE]
    companion inspect SESSION
    companion db upgrade
    companion breaker reset SESSION

Errors of the runtime print one line to stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from memory.errors import CompanionError

EXIT_USAGE = 2


def _settings():
    from runtime.config import Settings
    from runtime.logs import configure_logging

    settings = Settings.from_env()
    configure_logging(settings.log_level, settings.log_format)
    return settings


def cmd_replay(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from runtime.bootstrap import open_engine
    from runtime.replay import CATEGORIES, load_conversations, replay_conversation

    started = time.perf_counter()
    console = Console(stderr=False)
    conversations = load_conversations(Path(args.path), args.conversation)
    settings = _settings()
    engine = open_engine(settings)
    if args.window is not None:
        engine = engine.derive(window=args.window)
    reports = []
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=False,
    ) as progress:
        for conv in conversations:
            task = progress.add_task(f"replay {conv.id}", total=len(conv.turns))
            reports.append(replay_conversation(engine, conv, on_turn=lambda t=task: progress.advance(t)))

    def pct(value):
        return "-" if value is None else f"{100 * value:.1f}%"

    table = Table(title=f"companion replay {args.path} (window {engine.window} tokens)")
    table.add_column("figure")
    for r in reports:
        table.add_column(r.conversation, justify="right")
    rows = [
        ("turns", lambda r: str(r.turns)),
        ("sessions", lambda r: str(r.sessions)),
        ("compactions", lambda r: str(r.compactions)),
        ("compaction failures", lambda r: str(r.compaction_failures)),
        ("archived segments", lambda r: str(r.archived_segments)),
        ("summary tokens", lambda r: str(r.summary_tokens)),
        ("largest context / window", lambda r: f"{r.largest_context} / {r.window}"),
        ("overflows", lambda r: str(r.overflows)),
        ("evidence recall, in context", lambda r: pct(r.recall("in_context"))),
        ("evidence recall, retrieval only", lambda r: pct(r.recall("retrieval"))),
    ]
    for cat in CATEGORIES.values():
        rows.append((f"  {cat}: in context / retrieval", lambda r, c=cat: f"{pct(r.recall('in_context', c))} / {pct(r.recall('retrieval', c))}"))
    rows.append(("wall time", lambda r: f"{r.wall_seconds:.1f} s"))
    for name, fn in rows:
        table.add_row(name, *[fn(r) for r in reports])
    console.print(table)
    total = time.perf_counter() - started
    console.print(f"total wall time {total:.1f} s; sessions are kept in the database (e.g. {reports[0].session_id if reports else '-'}).")
    if args.report:
        Path(args.report).write_text(
            json.dumps({"window": engine.window, "wall_seconds": total, "conversations": [r.as_dict() for r in reports]}, indent=2, default=str),
            encoding="utf-8",
        )
    return 1 if any(r.overflows for r in reports) else 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from runtime.bootstrap import open_engine

    engine = open_engine(_settings())
    session = engine.store.get_session(args.session)
    if session is None:
        print(f"error: no session {args.session!r}", file=sys.stderr)
        return EXIT_USAGE
    context = engine.assemble(user_id=session.user_id, session_id=session.id)
    table = Table(title=f"context of {session.id} ({context.total_tokens} + {context.reply_reserve} reserved of {context.window} tokens)")
    for col in ("source", "tokens", "cap", "items", "cut"):
        table.add_column(col)
    for report in context.sources.values():
        table.add_row(report.source, str(report.tokens), str(report.cap), str(report.items), report.cut or "")
    Console().print(table)
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from memory.database import upgrade
    from memory.embeddings import SentenceTransformerEmbedder
    from runtime.bootstrap import connect

    settings = _settings()
    database = connect(settings)
    dim = args.embedding_dim or SentenceTransformerEmbedder(settings.embedding_model).dimension
    revision = upgrade(database.engine, embedding_dim=dim)
    print(f"database at revision {revision} ({'embedded' if database.embedded else 'DATABASE_URL'})")
    return 0


def cmd_breaker_reset(args: argparse.Namespace) -> int:
    import structlog

    from memory.store import Store
    from runtime.bootstrap import connect

    database = connect(_settings())
    store = Store(database.engine)
    if store.get_session(args.session) is None:
        print(f"error: no session {args.session!r}", file=sys.stderr)
        return EXIT_USAGE
    store.reset_breaker(args.session)
    structlog.get_logger("companion.cli").info("breaker.reset", session_id=args.session, breaker_state="closed")
    print(f"breaker closed for {args.session}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="companion", description="companion-runtime: long-running companion chat.")
    sub = parser.add_subparsers(dest="command", required=True)

    replay = sub.add_parser("replay", help="replay a stored conversation (LoCoMo .json or .jsonl) through the engine")
    replay.add_argument("path", help="a LoCoMo JSON file or a JSONL file of {role, content, timestamp}")
    replay.add_argument("--conversation", help="LoCoMo sample_id to replay (default: all)")
    replay.add_argument("--window", type=int, help="the model's context window in tokens; every budget scales to it")
    replay.add_argument("--report", help="write the figures as JSON to this file")
    replay.set_defaults(func=cmd_replay)

    inspect = sub.add_parser("inspect", help="show a session's assembled context by source")
    inspect.add_argument("session")
    inspect.set_defaults(func=cmd_inspect)

    db = sub.add_parser("db", help="database commands")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    up = db_sub.add_parser("upgrade", help="apply the migrations")
    up.add_argument("--embedding-dim", type=int, help="vector(N) for a new archive table (default: the embedding model's)")
    up.set_defaults(func=cmd_db_upgrade)

    breaker = sub.add_parser("breaker", help="compaction circuit breaker")
    b_sub = breaker.add_subparsers(dest="breaker_command", required=True)
    reset = b_sub.add_parser("reset", help="close a session's breaker")
    reset.add_argument("session")
    reset.set_defaults(func=cmd_breaker_reset)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CompanionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
