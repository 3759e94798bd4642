"""``companion db`` (upgrade, reembed), ``companion breaker`` and ``companion session``: schema, breaker and session commands."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from runtime.cli._common import EXIT_INTERRUPTED, EXIT_USAGE, _settings

if TYPE_CHECKING:
    from rich.progress import TaskID


def cmd_session_delete(args: argparse.Namespace) -> int:
    """Delete a session, its turns, summary, archive and the files no other session references."""
    from runtime.service import open_engine

    engine = open_engine(_settings(), with_model=False)
    if engine.store.sessions.get(args.session) is None:
        print(f"error: no session {args.session!r}", file=sys.stderr)
        return EXIT_USAGE
    counts = engine.delete_session(user_id=args.user, session_id=args.session)
    print(", ".join(f"{kind}: {n}" for kind, n in counts.items()))
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from memory.database import upgrade
    from memory.embeddings import SentenceTransformerEmbedder
    from runtime.llm import is_api_model
    from runtime.service import api_embedder, connect

    settings = _settings()
    database = connect(settings)
    dim = args.embedding_dim or (
        api_embedder(settings).dimension
        if is_api_model(settings.embedding_model)
        else SentenceTransformerEmbedder(settings.embedding_model).dimension
    )
    revision = upgrade(database.engine, embedding_dim=dim)
    print(f"database at revision {revision} ({'embedded' if database.embedded else 'DATABASE_URL'})")
    return 0


def cmd_db_reembed(args: argparse.Namespace) -> int:
    """Re-embed every stored vector with ``COMPANION_EMBEDDING_MODEL`` beside the old ones, then
    switch to them and record the model (:mod:`memory.reembed`); resumable, turns go on meanwhile."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from memory.database import current_revision, head_revision, require_schema, upgrade, vector_dimension
    from memory.embeddings import Embedder, model_embedder
    from memory.reembed import reembed
    from memory.vector_model import recorded_model
    from runtime.accounting import counter_for
    from runtime.context import without_names
    from runtime.llm import is_api_model
    from runtime.service import api_embedder, connect

    if args.batch < 1:
        print(f"error: --batch must be at least 1, got {args.batch}", file=sys.stderr)
        return EXIT_USAGE
    settings = _settings()
    database = connect(settings)
    embedder: Embedder = (
        api_embedder(settings)
        if is_api_model(settings.embedding_model)
        else model_embedder(
            settings.embedding_model,
            threads=settings.embed_threads,
            backend=settings.embed_backend,
            cache_dir=settings.model_cache_dir,
        )
    )
    if database.embedded and current_revision(database.engine) != head_revision():
        upgrade(database.engine, embedding_dim=embedder.dimension)
    require_schema(database.engine)
    previous = recorded_model(database.engine)
    dim = vector_dimension(database.engine)
    print(
        f"re-embedding every stored vector with {embedder.name!r} ({embedder.dimension} dimensions; "
        f"recorded: {f'{previous.name!r} ({previous.dimension})' if previous else 'none'}"
        f"{f'; the vector columns go from {dim} to {embedder.dimension} dimensions' if dim != embedder.dimension else ''}"
        "); recall uses the old vectors until the switch, and an interrupted run resumes where it stopped",
        flush=True,
    )
    counter = counter_for(settings.model)
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)
            if not console.is_terminal:
                print(f"  {stage}: {done}/{total}", flush=True)

        try:
            result = reembed(
                database.engine,
                embedder,
                count_tokens=counter.count_text,
                user_text=without_names,
                batch=args.batch,
                progress=progress,
            )
        except KeyboardInterrupt:
            print(
                "interrupted: the old vectors are still in use; run it again to go on from where it stopped",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED
    print(
        f"done: {result.turn_vectors} turn vectors, {result.archive_keys} archive keys "
        f"({result.keys_matched} in their compaction's window, {result.keys_full_window} in the full window, "
        f"{result.keys_from_content} from their content), {result.knowledge_chunks} knowledge chunks"
        f"{f' ({result.resumed} rows staged by an earlier run)' if result.resumed else ''}; "
        f"model {result.model.name!r} ({result.model.dimension}) recorded; writes waited "
        f"{result.switch_seconds:.2f} s for the switch. "
        "Restart every process of the runtime with this COMPANION_EMBEDDING_MODEL."
    )
    return 0


def _breaker_store(session: str):
    settings = _settings(database=True)

    from memory.store import Store
    from runtime.service import connect

    store = Store(connect(settings).engine)
    if store.sessions.get(session) is None:
        print(f"error: no session {session!r}", file=sys.stderr)
        return None
    return store


def cmd_breaker_show(args: argparse.Namespace) -> int:
    store = _breaker_store(args.session)
    if store is None:
        return EXIT_USAGE
    state = store.compaction.state(args.session)
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
