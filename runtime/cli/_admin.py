"""``companion db``, ``companion breaker`` and ``companion session``: schema, breaker and session commands."""

from __future__ import annotations

import argparse
import sys

from runtime.cli._common import EXIT_USAGE, _settings


def cmd_session_delete(args: argparse.Namespace) -> int:
    """Delete a session, its turns, summary, archive and the files no other session references."""
    from runtime.service import open_engine

    engine = open_engine(_settings(), with_model=False)
    if engine.store.get_session(args.session) is None:
        print(f"error: no session {args.session!r}", file=sys.stderr)
        return EXIT_USAGE
    counts = engine.delete_session(user_id=args.user, session_id=args.session)
    print(", ".join(f"{kind}: {n}" for kind, n in counts.items()))
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from memory.database import upgrade
    from memory.embeddings import SentenceTransformerEmbedder
    from runtime.service import connect

    settings = _settings()
    database = connect(settings)
    dim = args.embedding_dim or SentenceTransformerEmbedder(settings.embedding_model).dimension
    revision = upgrade(database.engine, embedding_dim=dim)
    print(f"database at revision {revision} ({'embedded' if database.embedded else 'DATABASE_URL'})")
    return 0


def _breaker_store(session: str):
    from memory.store import Store
    from runtime.service import connect

    store = Store(connect(_settings()).engine)
    if store.get_session(session) is None:
        print(f"error: no session {session!r}", file=sys.stderr)
        return None
    return store


def cmd_breaker_show(args: argparse.Namespace) -> int:
    store = _breaker_store(args.session)
    if store is None:
        return EXIT_USAGE
    state = store.compaction_state(args.session)
    opened = state.breaker_opened_at
    print(f"breaker {'open since ' + opened.isoformat() if opened else 'closed'} for {args.session}")
    print(f"consecutive failures: {state.consecutive_failures}; successful compactions: {state.compactions}")
    for reason in state.recent_errors or []:
        print(f"  failure: {reason}")
    return 0


def cmd_breaker_reset(args: argparse.Namespace) -> int:
    from runtime.compaction import reset_breaker

    store = _breaker_store(args.session)
    if store is None:
        return EXIT_USAGE
    reset_breaker(store, args.session)
    print(f"breaker closed for {args.session}")
    return 0
