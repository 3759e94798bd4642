"""The ``companion`` command line.

::

    companion replay PATH [--conversation ID] [--window TOKENS] [--report FILE] [--plot FILE.png|FILE.html]
    companion inspect SESSION
    companion chat --user USER --session SESSION [--persona FILE]
    companion db upgrade
    companion breaker show SESSION
    companion breaker reset SESSION
    companion files add USER PATH... [--ephemeral --session SESSION] [--no-wait]
    companion files list USER
    companion files show ID
    companion files read ID [--start-page N] [--max-pages N] [--focus WORD]
    companion files delete ID
    companion files export ID PATH
    companion files edit ID PATH
    companion session delete SESSION --user USER

    companion persona show FILE [--user NAME]
    companion kb add PERSONA FILE... | kb list PERSONA | kb remove PERSONA FILE
    companion profile show USER | profile set USER [--name N] [--pronouns P] [--fact F ...] [--clear-facts]
    companion serve [--host H] [--port P]
    companion apps create NAME | companion apps list
    companion jobs run | companion jobs close-idle --once [--idle-hours H] [--worker ID]

In ``companion chat``, ``/attach PATH_OR_ID ...`` attaches files to the next message.

Errors of the runtime print one line to stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

from errors import CompanionError

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

    from runtime.service import open_engine
    from runtime.service import load_conversations, replay_conversation

    started = time.perf_counter()
    if args.report:
        report_dir = Path(args.report).expanduser().resolve().parent
        if not report_dir.is_dir():
            print(f"error: the directory of --report {args.report!r} does not exist; create it first.", file=sys.stderr)
            return EXIT_USAGE
    if args.plot:
        from runtime.service.replay_plot import check_plot_path

        check_plot_path(args.plot)  # a bad --plot fails before the replay runs
    if args.window is not None:
        from runtime.accounting import Budgets

        Budgets.create().scaled_to(args.window)  # a bad --window fails before the database starts
    console = Console(stderr=False, width=max(Console().width, 160))
    conversations = load_conversations(Path(args.path), args.conversation)
    settings = _settings()
    engine = open_engine(settings, with_model=False)  # replies come from the file
    if args.window is not None:
        engine = engine.derive(window=args.window)
    reports = []
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=False,
    ) as progress:
        for conv in conversations:
            task = progress.add_task(f"replay {conv.id}", total=len(conv.turns))
            reports.append(replay_conversation(engine, conv, on_turn=functools.partial(progress.advance, task)))

    console.print(_replay_tables(reports, title=f"companion replay {args.path} (window {engine.window} tokens)"))
    total = time.perf_counter() - started
    console.print(f"total wall time {total:.1f} s; sessions are kept in the database (e.g. {reports[0].session_id if reports else '-'}).")
    if args.report:
        Path(args.report).write_text(
            json.dumps({"window": engine.window, "wall_seconds": total, "conversations": [r.as_dict() for r in reports]}, indent=2, default=str),
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
    for col in ("conversation", "turns", "sessions", "compactions", "segments", "summary tok", "largest / window", "overflows", "user turns kept", "recall ctx", "recall ret", "wall s"):
        main.add_column(col, justify="left" if col == "conversation" else "right")
    sums = {k: 0 for k in ("turns", "sessions", "compactions", "archived_segments", "overflows", "users", "kept")}
    ev_total = ev_ctx = ev_ret = 0
    for r in reports:
        users, kept = r.user_turns, r.user_turns_recoverable
        main.add_row(
            r.conversation, str(r.turns), str(r.sessions), str(r.compactions), str(r.archived_segments),
            str(r.summary_tokens), f"{r.largest_context} / {r.window}", str(r.overflows),
            f"{kept}/{users}" if users else "-",
            _pct(r.evidence_in_context.get("all", 0), r.evidence_total.get("all", 0)),
            _pct(r.evidence_retrieval.get("all", 0), r.evidence_total.get("all", 0)),
            f"{r.wall_seconds:.1f}",
        )
        for key, value in (("turns", r.turns), ("sessions", r.sessions), ("compactions", r.compactions),
                           ("archived_segments", r.archived_segments), ("overflows", r.overflows), ("users", users), ("kept", kept)):
            sums[key] += value
        ev_total += r.evidence_total.get("all", 0)
        ev_ctx += r.evidence_in_context.get("all", 0)
        ev_ret += r.evidence_retrieval.get("all", 0)
    if len(reports) > 1:
        main.add_row(
            "all", str(sums["turns"]), str(sums["sessions"]), str(sums["compactions"]), str(sums["archived_segments"]),
            "", f"{max(r.largest_context for r in reports)} / {reports[0].window}", str(sums["overflows"]),
            f"{sums['kept']}/{sums['users']}" if sums["users"] else "-",
            _pct(ev_ctx, ev_total), _pct(ev_ret, ev_total), f"{sum(r.wall_seconds for r in reports):.1f}",
        )
    by_cat = Table(title="evidence recall by category: in context / retrieval only (evidence turns)")
    by_cat.add_column("conversation")
    for name in CATEGORIES.values():
        by_cat.add_column(name, justify="right")
    totals = {name: [0, 0, 0] for name in CATEGORIES.values()}
    for r in reports:
        cells = []
        for name in CATEGORIES.values():
            n, c, t = r.evidence_total.get(name, 0), r.evidence_in_context.get(name, 0), r.evidence_retrieval.get(name, 0)
            totals[name] = [totals[name][0] + n, totals[name][1] + c, totals[name][2] + t]
            cells.append(f"{_pct(c, n)} / {_pct(t, n)} ({n})" if n else "-")
        by_cat.add_row(r.conversation, *cells)
    if len(reports) > 1:
        by_cat.add_row("all", *[f"{_pct(c, n)} / {_pct(t, n)} ({n})" if n else "-" for n, c, t in totals.values()])
    return Group(main, by_cat)


def context_table(context):
    """The assembled context by source (tokens, cap, items, what was cut): one rich table,
    printed by ``companion inspect`` and by ``/context`` in ``companion chat``."""
    from rich.table import Table

    title = f"context of {context.session_id} ({context.total_tokens} + {context.reply_reserve} reserved of {context.window} tokens)"
    table = Table(title=title, min_width=len(title))
    for col in ("source", "tokens", "cap", "items", "cut"):
        table.add_column(col)
    for report in context.sources.values():
        table.add_row(report.source, str(report.tokens), str(report.cap), str(report.items), report.cut or "")
    return table


def cmd_inspect(args: argparse.Namespace) -> int:
    from rich.console import Console

    from runtime.service import open_engine

    engine = open_engine(_settings())
    session = engine.store.get_session(args.session)
    if session is None:
        print(f"error: no session {args.session!r}", file=sys.stderr)
        return EXIT_USAGE
    Console().print(context_table(engine.assemble(user_id=session.user_id, session_id=session.id)))
    return 0


class _Speaker:
    """Writes a streamed reply to stdout, behind ``NAME> `` printed with its first piece (so
    that anything logged while the context is prepared comes before it)."""

    def __init__(self, name: str) -> None:
        self.prefix = f"{name}> "
        self.started = False

    def __call__(self, piece: str) -> None:
        if not self.started:
            sys.stdout.write(self.prefix)
            self.started = True
        sys.stdout.write(piece)
        sys.stdout.flush()


def cmd_chat(args: argparse.Namespace) -> int:
    """A terminal chat: each line is a user turn; the reply streams back. ``/context`` prints
    the assembled context by source, ``/attach PATH_OR_ID ...`` attaches files (a path is
    stored first) to the next line, ``/quit`` or end of input (Ctrl-D) ends it."""
    from rich.console import Console

    from errors import FileError, InvalidMessageError, ModelAuthError, TurnError
    from persona import load_persona
    from runtime.service import open_engine

    from runtime._offline import load_litellm

    litellm = load_litellm()
    litellm.suppress_debug_info = True  # its "Give Feedback" banners would land in the conversation on stdout
    settings = _settings()
    persona = load_persona(Path(args.persona)) if args.persona else None
    engine = open_engine(settings, persona=persona)
    existing = engine.store.get_session(args.session)
    if existing is not None and existing.user_id != args.user:
        print(f"error: session {args.session!r} belongs to user {existing.user_id!r}, not {args.user!r}", file=sys.stderr)
        return EXIT_USAGE
    console = Console(width=max(Console().width, 100))
    echo = not sys.stdin.isatty()  # piped input: show each line after its prompt, as a terminal would
    name = engine.persona.name
    print(
        f"companion chat: session {args.session} (user {args.user}) with {name} on {engine.settings.model}, "
        f"window {engine.window} tokens. /context shows the context; /attach PATH_OR_ID attaches files to "
        "your next line; /quit or Ctrl-D ends.",
        flush=True,
    )
    attach: list[str] = []  # file ids for the next line
    if existing is None:  # a new session opens with the character's first message, if it has one
        greeting = engine.greet(user_id=args.user, session_id=args.session, greeting=args.greeting)
        if greeting is not None:
            print(f"{name}> {greeting.content}", flush=True)
    while True:
        try:
            line = input("you> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if echo:
            print(line, flush=True)
        command = line.strip()
        if not command:
            continue
        if command == "/quit":
            return 0
        if command == "/context":
            console.print(context_table(engine.assemble(user_id=args.user, session_id=args.session)))
            continue
        if command.startswith("/attach"):
            try:
                attach.extend(_attach(engine, args.user, command.split()[1:]))
            except FileError as exc:
                print(f"error: {exc}", file=sys.stderr, flush=True)
            print(f"[attached to your next message: {', '.join(attach) or 'nothing'}]", flush=True)
            continue
        if command.startswith("/") and " " not in command:
            print("commands: /context (the assembled context by source), /attach PATH_OR_ID ..., /quit")
            continue
        speaker = _Speaker(name)
        try:
            result = engine.turn(
                user_id=args.user, session_id=args.session, message=line, on_delta=speaker, attachments=attach
            )
            attach = []
        except FileError as exc:  # an attachment is not the user's; nothing was stored
            print(f"error: {exc}", file=sys.stderr, flush=True)
            attach = []
            continue
        except ModelAuthError as exc:  # no later line can fix a refused key
            print("", end="\n" if speaker.started else "", flush=True)
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except (TurnError, InvalidMessageError) as exc:  # the user turn, if valid, is stored; carry on
            print("", end="\n" if speaker.started else "", flush=True)
            print(f"error: {exc}", file=sys.stderr, flush=True)
            continue
        if not speaker.started:  # an empty reply
            sys.stdout.write(speaker.prefix)
        print()
        if result.assistant_turn.interrupted:
            print("[the reply broke off; what arrived is stored, marked interrupted]")
        for outcome in result.compactions:
            if outcome.ok and outcome.summarized:
                print(
                    f"[compacted: {outcome.rolled_turns} turns rolled out into the summary "
                    f"({outcome.summary_tokens} tokens) and {outcome.segments} archived segments]"
                )
            elif outcome.ok:
                print(f"[compacted, breaker open: {outcome.rolled_turns} turns archived in {outcome.segments} segments]")
            else:
                print(f"[compaction failed: {outcome.error}]")
        sys.stdout.flush()


def _attach(engine, user_id: str, targets: list[str]) -> list[str]:
    """File ids for ``/attach``: an existing path is stored (and its parse started), anything else is an id."""
    ids = []
    for target in targets:
        path = Path(target).expanduser()
        if path.is_file():
            ids.append(engine.file_services.upload(user_id=user_id, name=path.name, data=path.read_bytes()).id)
        else:
            ids.append(target)
    return ids


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


# -- personas, knowledge base, pinned profiles ----------------------------------
def cmd_persona_show(args: argparse.Namespace) -> int:
    """Print the persona as the model sees it, with tokens per part and the budget."""
    from persona import load_persona
    from runtime.context import render_persona
    from runtime.accounting import counter_for

    settings = _settings()
    persona = load_persona(Path(args.file))
    budgets = settings.scaled_budgets
    rendered = render_persona(persona, cap=budgets.persona, counter=counter_for(settings.model), user_name=args.user)
    print(rendered.system["content"])
    if rendered.post_history:
        print("\n[after the recent turns]\n" + rendered.post_history["content"])
    print(f"\n{persona.name} ({persona.source}): {rendered.tokens} of {budgets.persona} persona tokens")
    for part, tokens in rendered.parts.items():
        print(f"  {part}: {tokens}")
    print(f"  example dialogues: {rendered.examples_kept} of {rendered.examples_total} shown")
    book = persona.character_book
    print(f"  lorebook entries: {len(book.entries) if book else 0}; first message: {'yes' if persona.first_message else 'no'}")
    return 0


def _persona_name(value: str) -> str:
    """A persona name, or the name inside a persona file when ``value`` ends in a persona suffix."""
    from persona import SUFFIXES, load_persona

    path = Path(value).expanduser()
    if path.suffix.lower() in SUFFIXES:  # a persona file (a missing one is an error, not a name)
        return load_persona(path).name
    return value


def _kb_engine():
    from runtime.service import open_engine

    return open_engine(_settings(), with_model=False)


def cmd_kb_add(args: argparse.Namespace) -> int:
    from runtime.files import add_texts, read_documents

    persona = _persona_name(args.persona)
    # every file is read (and checked) once, before the database and the embedding model start
    texts = read_documents([Path(f).expanduser() for f in args.files])
    engine = _kb_engine()
    added = add_texts(
        engine.store.engine, persona=persona, texts=texts, embedder=engine.embedder, counter=engine.counter,
        max_tokens=engine.settings.knowledge_chunk_tokens,
    )
    for item in added:
        print(f"{persona}: {item.source}: {item.chunks} chunks, {item.tokens} tokens")
    return 0


def cmd_kb_list(args: argparse.Namespace) -> int:
    from memory.knowledge import list_sources

    persona = _persona_name(args.persona)
    sources = list_sources(_kb_engine().store.engine, persona=persona)
    if not sources:
        print(f"{persona}: no knowledge files")
    for item in sources:
        print(f"{persona}: {item.source}: {item.chunks} chunks, {item.tokens} tokens, added {item.added_at:%Y-%m-%d %H:%M}")
    return 0


def cmd_kb_remove(args: argparse.Namespace) -> int:
    from memory.knowledge import remove_source

    persona = _persona_name(args.persona)
    deleted = remove_source(_kb_engine().store.engine, persona=persona, source=Path(args.file).name)
    if not deleted:
        print(f"error: {persona} has no knowledge file {Path(args.file).name!r}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{persona}: removed {Path(args.file).name} ({deleted} chunks)")
    return 0


def _profiles():
    from memory.profiles import Profiles
    from runtime.service import connect

    return Profiles(connect(_settings()).engine)


def _print_profile(user: str, profile) -> None:
    if profile is None:
        print(f"{user}: no profile")
        return
    print(f"{user}: name {profile.name or '-'}; pronouns {profile.pronouns or '-'}")
    for fact in profile.facts:
        print(f"  fact: {fact}")
    for fact in profile.learned:
        print(f"  learned: {fact}")


def cmd_profile_show(args: argparse.Namespace) -> int:
    _print_profile(args.user, _profiles().get(args.user))
    return 0


def cmd_profile_set(args: argparse.Namespace) -> int:
    profiles = _profiles()
    facts = None
    if args.clear_facts or args.fact:
        before = profiles.get(args.user)
        facts = ([] if args.clear_facts or before is None else list(before.facts)) + list(args.fact or [])
    _print_profile(args.user, profiles.set(args.user, name=args.name, pronouns=args.pronouns, facts=facts))
    return 0


def _add_persona_commands(sub) -> None:
    persona = sub.add_parser("persona", help="persona files")
    p_sub = persona.add_subparsers(dest="persona_command", required=True)
    show = p_sub.add_parser("show", help="print a persona as the model sees it, with tokens per part")
    show.add_argument("file", help="a card (.json, .png) or our .toml/.yaml file")
    show.add_argument("--user", default="User", help="what {{user}} becomes (default: User)")
    show.set_defaults(func=cmd_persona_show)

    kb = sub.add_parser("kb", help="a persona's knowledge base")
    kb_sub = kb.add_subparsers(dest="kb_command", required=True)
    add = kb_sub.add_parser("add", help="split text/Markdown files into chunks and embed them for the persona")
    add.add_argument("persona", type=_id_arg, help="the persona's name, or a persona file to take the name from")
    add.add_argument("files", nargs="+", help="plain text or Markdown files; adding a file again replaces it")
    add.set_defaults(func=cmd_kb_add)
    lst = kb_sub.add_parser("list", help="the persona's knowledge files")
    lst.add_argument("persona", type=_id_arg)
    lst.set_defaults(func=cmd_kb_list)
    rm = kb_sub.add_parser("remove", help="remove one file's chunks")
    rm.add_argument("persona", type=_id_arg)
    rm.add_argument("file")
    rm.set_defaults(func=cmd_kb_remove)

    profile = sub.add_parser("profile", help="a user's pinned profile")
    pr_sub = profile.add_subparsers(dest="profile_command", required=True)
    pshow = pr_sub.add_parser("show", help="the user's name, pronouns, facts and learned facts")
    pshow.add_argument("user", type=_id_arg)
    pshow.set_defaults(func=cmd_profile_show)
    pset = pr_sub.add_parser("set", help="set name, pronouns or facts")
    pset.add_argument("user", type=_id_arg)
    pset.add_argument("--name", help="what the user wants to be called ('' clears)")
    pset.add_argument("--pronouns", help="e.g. she/her ('' clears)")
    pset.add_argument("--fact", action="append", help="add a fact (repeatable)")
    pset.add_argument("--clear-facts", action="store_true", help="remove the user-set facts first")
    pset.set_defaults(func=cmd_profile_set)
# -- the HTTP service, apps and the close job --------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    """Open the engine once and serve the HTTP API under uvicorn until Ctrl-C."""
    import uvicorn

    from runtime.service.api import create_app
    from runtime.service import open_engine

    settings = _settings()
    engine = open_engine(settings)
    host = args.host or settings.api_host
    port = settings.api_port if args.port is None else args.port
    print(f"companion serve: http://{host}:{port} (OpenAPI at /openapi.json, docs at /docs)", flush=True)
    uvicorn.run(create_app(engine), host=host, port=port, log_level=settings.log_level, access_log=False)
    return 0


def _directory():
    from memory.apps import Directory
    from memory.database import require_schema, upgrade
    from runtime.service import connect

    settings = _settings()
    database = connect(settings)
    if database.embedded:
        from memory.embeddings import SentenceTransformerEmbedder

        upgrade(database.engine, embedding_dim=SentenceTransformerEmbedder(settings.embedding_model).dimension)
    require_schema(database.engine)
    return Directory(database.engine)


def cmd_apps_create(args: argparse.Namespace) -> int:
    app, key = _directory().create_app(args.name)
    print(f"app {app.name} ({app.id}) created. Its API key, shown only this once:")
    print(key)
    return 0


def cmd_apps_list(args: argparse.Namespace) -> int:
    apps = _directory().apps()
    if not apps:
        print("no apps; create one with `companion apps create NAME`")
    for app in apps:
        print(f"{app.id}\t{app.name}\tcreated {app.created_at.isoformat()}")
    return 0


def _job_engine():
    from runtime.service import open_engine

    settings = _settings()
    return settings, open_engine(settings)


def cmd_jobs_run(args: argparse.Namespace) -> int:
    from runtime.service import run_scheduler

    settings, engine = _job_engine()
    print(
        f"companion jobs run: closing sessions idle for {settings.close_idle_hours:g} h on cron "
        f"{settings.close_cron!r} (local time); Ctrl-C stops.",
        flush=True,
    )
    run_scheduler(
        engine,
        cron=settings.close_cron,
        idle_seconds=settings.close_idle_hours * 3600,
        batch=settings.close_batch,
        worker_id=args.worker,
    )
    return 0


def cmd_jobs_close_idle(args: argparse.Namespace) -> int:
    from runtime.service import close_idle_sessions

    if not args.once:
        print("error: add --once to run the close job once now (or use `companion jobs run` for the schedule)", file=sys.stderr)
        return EXIT_USAGE
    settings, engine = _job_engine()
    hours = settings.close_idle_hours if args.idle_hours is None else args.idle_hours
    report = close_idle_sessions(engine, idle_seconds=hours * 3600, worker_id=args.worker, batch=settings.close_batch)
    print(
        f"close-idle ({report.worker_id}, idle > {hours:g} h): claimed {report.claimed}, "
        f"closed {len(report.closed)}, failed {len(report.failed)}, turns rolled out {report.rolled_turns}"
    )
    for session_id, reason in report.failed.items():
        print(f"  failed {session_id}: {reason}")
    return 1 if report.failed else 0


def _add_service_commands(sub) -> None:
    serve = sub.add_parser("serve", help="serve the HTTP API (FastAPI under uvicorn)")
    serve.add_argument("--host", help="address to listen on (default: COMPANION_API_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=_port_arg, help="TCP port (default: COMPANION_API_PORT or 8080; 0 picks a free one)")
    serve.set_defaults(func=cmd_serve)

    apps = sub.add_parser("apps", help="client apps and their API keys")
    a_sub = apps.add_subparsers(dest="apps_command", required=True)
    create = a_sub.add_parser("create", help="create an app and print its API key (once)")
    create.add_argument("name")
    create.set_defaults(func=cmd_apps_create)
    a_sub.add_parser("list", help="list the apps (never their keys)").set_defaults(func=cmd_apps_list)

    jobs = sub.add_parser("jobs", help="the session-close job")
    j_sub = jobs.add_subparsers(dest="jobs_command", required=True)
    run = j_sub.add_parser("run", help="run the close job on COMPANION_CLOSE_CRON until Ctrl-C")
    run.add_argument("--worker", help="worker id recorded as closed_by (default HOST:PID)")
    run.set_defaults(func=cmd_jobs_run)
    once = j_sub.add_parser("close-idle", help="close idle sessions now")
    once.add_argument("--once", action="store_true", help="run once and exit (for cron or tests)")
    once.add_argument("--idle-hours", type=_hours_arg, help="idle threshold in hours (default: COMPANION_CLOSE_IDLE_HOURS)")
    once.add_argument("--worker", help="worker id recorded as closed_by (default HOST:PID)")
    once.set_defaults(func=cmd_jobs_close_idle)


# -- files ----------------------------------------------------------------------
FILES_ADD_WAIT_SECONDS = 600.0
"""``files add`` waits this long at most for each parse before it reports the state it has."""


def _file_services(settings=None):
    """The file services on the configured database (migrated first when embedded)."""
    from memory.database import current_revision, head_revision, require_schema, upgrade
    from runtime.service import connect
    from runtime.files import open_file_services

    settings = settings or _settings()
    database = connect(settings)
    if database.embedded and current_revision(database.engine) != head_revision():
        from memory.embeddings import SentenceTransformerEmbedder

        upgrade(database.engine, embedding_dim=SentenceTransformerEmbedder(settings.embedding_model).dimension)
    require_schema(database.engine)
    return open_file_services(settings, database.engine)


def _file_line(stored) -> str:
    pages = f"{stored.page_count} page(s)" if stored.page_count is not None else "pages unknown"
    body = f", body from page {stored.body_start_page}" if stored.body_start_page else ""
    scope = stored.durability + (f" (session {stored.session_id})" if stored.session_id else "")
    return (
        f"{stored.id}  {stored.name}  {stored.mime}  {stored.size_bytes:,} bytes  {scope}  "
        f"{stored.parse_state}, {pages}{body}"
    )


def cmd_files_add(args: argparse.Namespace) -> int:
    if args.ephemeral != (args.session is not None):
        print("error: --ephemeral and --session go together: an ephemeral file is valid in one session.", file=sys.stderr)
        return EXIT_USAGE
    paths = [Path(p).expanduser() for p in args.paths]
    for path in paths:  # check every path before storing anything
        if not path.is_file():
            print(f"error: {str(path)!r} is not a readable file.", file=sys.stderr)
            return EXIT_USAGE
    services = _file_services()
    status = 0
    try:
        store = services.files.add if args.no_wait else services.upload  # --no-wait: parsed on first read
        contents = [(path, path.read_bytes()) for path in paths]
        for path, data in contents:  # every file's name and size are checked before any is stored
            services.files.check(name=path.name, data=data)
        stored = [
            store(
                user_id=args.user,
                name=path.name,
                data=data,
                durability="ephemeral" if args.ephemeral else "durable",
                session_id=args.session,
            )
            for path, data in contents
        ]
        for item in stored:
            if not args.no_wait:
                services.parses.wait(item.id, FILES_ADD_WAIT_SECONDS)
            item = services.files.get(item.id, user_id=args.user, with_extract=False)
            print(_file_line(item))
            if item.parse_state == "failed":
                print(f"  parse error: {item.parse_error}")
                status = 1
    finally:
        services.close()
    return status


def cmd_files_list(args: argparse.Namespace) -> int:
    services = _file_services()
    for item in services.files.list(user_id=args.user):
        print(_file_line(item))
    return 0


def cmd_files_show(args: argparse.Namespace) -> int:
    services = _file_services()
    item = services.files.lookup(args.file_id)
    print(_file_line(item))
    print(f"owner {item.user_id}; sha256 {item.sha256}; stored {item.created_at.isoformat()}; "
          f"referenced by {services.files.reference_count(item.id)} turn(s)")
    if item.parse_error:
        print(f"parse error: {item.parse_error}")
    if item.extract:
        print(f"extract: {len(item.extract):,} characters")
    return 0


def cmd_files_read(args: argparse.Namespace) -> int:
    services = _file_services()
    try:
        owner = services.files.lookup(args.file_id).user_id
        print(services.reader.file_read(
            args.file_id, owner, start_page=args.start_page, max_pages=args.max_pages, focus=args.focus
        ))
    finally:
        services.close()
    return 0


def cmd_files_delete(args: argparse.Namespace) -> int:
    services = _file_services()
    item = services.files.lookup(args.file_id)
    references = services.files.reference_count(item.id)
    services.files.delete(item.id, user_id=item.user_id)
    print(f"deleted {item.id} ({item.name}); {references} turn reference(s) removed")
    return 0


def cmd_files_export(args: argparse.Namespace) -> int:
    out = Path(args.path).expanduser()
    if not out.parent.is_dir():
        print(f"error: the directory of {args.path!r} does not exist; create it first.", file=sys.stderr)
        return EXIT_USAGE
    services = _file_services()
    owner = services.files.lookup(args.file_id).user_id
    stored, data = services.files.export(args.file_id, user_id=owner)
    out.write_bytes(data)
    print(f"wrote {len(data):,} bytes of {stored.id} ({stored.name}) to {out}")
    return 0


def cmd_files_edit(args: argparse.Namespace) -> int:
    path = Path(args.path).expanduser()
    if not path.is_file():
        print(f"error: {args.path!r} is not a readable file.", file=sys.stderr)
        return EXIT_USAGE
    services = _file_services()
    try:
        owner = services.files.lookup(args.file_id).user_id
        stored = services.edit(args.file_id, user_id=owner, data=path.read_bytes(), name=path.name)
        services.parses.wait(stored.id, FILES_ADD_WAIT_SECONDS)
        print(_file_line(services.files.get(stored.id, user_id=owner, with_extract=False)))
    finally:
        services.close()
    return 0


def _add_files_parser(sub) -> None:
    files = sub.add_parser("files", help="stored files: add, list, show, read (the file_read window), delete, export, edit")
    f_sub = files.add_subparsers(dest="files_command", required=True)
    add = f_sub.add_parser("add", help="store files for a user and parse them")
    add.add_argument("user", type=_id_arg, help="the owner's user id")
    add.add_argument("paths", nargs="+", metavar="PATH")
    add.add_argument("--ephemeral", action="store_true", help="valid only in --session (default: durable)")
    add.add_argument("--session", help="the session an ephemeral, type=_id_arg file is valid in")
    add.add_argument("--no-wait", action="store_true", help="store only; the parse runs on the first read or wait")
    add.set_defaults(func=cmd_files_add)
    lst = f_sub.add_parser("list", help="a user's files")
    lst.add_argument("user", type=_id_arg)
    lst.set_defaults(func=cmd_files_list)
    show = f_sub.add_parser("show", help="one file's metadata and parse state")
    show.add_argument("file_id")
    show.set_defaults(func=cmd_files_show)
    read = f_sub.add_parser("read", help="print what the file_read tool returns for a file")
    read.add_argument("file_id")
    read.add_argument("--start-page", type=int)
    read.add_argument("--max-pages", type=int)
    read.add_argument("--focus")
    read.set_defaults(func=cmd_files_read)
    delete = f_sub.add_parser("delete", help="delete a file, its blob and every turn's reference to it")
    delete.add_argument("file_id")
    delete.set_defaults(func=cmd_files_delete)
    export = f_sub.add_parser("export", help="write a durable file's stored bytes to PATH")
    export.add_argument("file_id")
    export.add_argument("path")
    export.set_defaults(func=cmd_files_export)
    edit = f_sub.add_parser("edit", help="replace a durable file's bytes with PATH, keeping its id, and parse again")
    edit.add_argument("file_id")
    edit.add_argument("path")
    edit.set_defaults(func=cmd_files_edit)


def _id_arg(value: str) -> str:
    """argparse type for a user, session or persona id: 1-200 printable characters
    (the same rule as the HTTP API, :func:`memory.apps.check_name`)."""
    from memory.apps import check_name
    from errors import InvalidRequestError

    try:
        return check_name(value, field="id")
    except InvalidRequestError as exc:
        raise argparse.ArgumentTypeError(f"{value!r}: {exc}") from None


def _port_arg(value: str) -> int:
    """argparse type for a TCP port: 0 (any free port) to 65535."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0-65535")
    return port


def _hours_arg(value: str) -> float:
    """argparse type for a non-negative number of hours."""
    try:
        hours = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of hours") from None
    if not hours >= 0 or hours == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r}: the idle threshold must be 0 or more hours")
    return hours


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="companion", description="companion-runtime: long-running companion chat.")
    sub = parser.add_subparsers(dest="command", required=True)

    replay = sub.add_parser("replay", help="replay a stored conversation (LoCoMo .json or .jsonl) through the engine")
    replay.add_argument("path", help="a LoCoMo JSON file or a JSONL file of {role, content, timestamp}")
    replay.add_argument("--conversation", help="LoCoMo sample_id to replay (default: all)")
    replay.add_argument("--window", type=int, help="the model's context window in tokens; every budget scales to it")
    replay.add_argument("--report", help="write the figures as JSON to this file")
    replay.add_argument(
        "--plot", help="draw the replay per turn (context by source, compactions, archive, recall) to a .png or .html file"
    )
    replay.set_defaults(func=cmd_replay)

    inspect = sub.add_parser("inspect", help="show a session's assembled context by source")
    inspect.add_argument("session", type=_id_arg)
    inspect.add_argument("--window", type=int, help="the context window the session runs with (e.g. a replay's --window)")
    inspect.set_defaults(func=cmd_inspect)

    chat = sub.add_parser("chat", help="a terminal chat that streams the replies (/context, /quit)")
    chat.add_argument("--user", required=True, type=_id_arg, help="the user id")
    chat.add_argument("--session", required=True, type=_id_arg, help="the session id (new or existing)")
    chat.add_argument("--persona", help="a persona file: card .json/.png, .toml, .yaml (default: COMPANION_PERSONA or the bundled one)")
    chat.add_argument(
        "--greeting", type=int, default=0,
        help="which greeting opens a new session: 0 the card's first message (default), N its N-th alternate greeting",
    )
    chat.set_defaults(func=cmd_chat)

    db = sub.add_parser("db", help="database commands")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    up = db_sub.add_parser("upgrade", help="apply the migrations")
    up.add_argument("--embedding-dim", type=int, help="vector(N) for a new archive table (default: the embedding model's)")
    up.set_defaults(func=cmd_db_upgrade)

    breaker = sub.add_parser("breaker", help="compaction circuit breaker")
    b_sub = breaker.add_subparsers(dest="breaker_command", required=True)
    show = b_sub.add_parser("show", help="a session's breaker state and the reasons of its current failures")
    show.add_argument("session", type=_id_arg)
    show.set_defaults(func=cmd_breaker_show)
    reset = b_sub.add_parser("reset", help="close a session's breaker")
    reset.add_argument("session", type=_id_arg)
    reset.set_defaults(func=cmd_breaker_reset)
    _add_files_parser(sub)
    session = sub.add_parser("session", help="session commands")
    s_sub = session.add_subparsers(dest="session_command", required=True)
    s_delete = s_sub.add_parser("delete", help="delete a session and the files no other session references")
    s_delete.add_argument("session", type=_id_arg)
    s_delete.add_argument("--user", required=True, type=_id_arg, help="the session's owner (checked)")
    s_delete.set_defaults(func=cmd_session_delete)
    _add_persona_commands(sub)
    _add_service_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CompanionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # the reader went away (`companion files read ID | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the Python docs' recipe for SIGPIPE
        return 1

