"""``companion serve``, ``companion apps`` and ``companion jobs``: the HTTP service, app keys, the close job."""

from __future__ import annotations

import argparse
import sys
import threading

from runtime.cli._common import EXIT_USAGE, _hours_arg, _port_arg, _settings


# -- the HTTP service, apps and the close job --------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    """Open the engine once and serve the HTTP API under uvicorn until Ctrl-C."""
    import uvicorn

    from runtime.service import open_engine
    from runtime.service.api import create_app

    settings = _settings()
    engine = open_engine(settings)
    # the embedding model loads in the background while the server starts, not in the first turn
    threading.Thread(target=_warm_embedder, args=(engine,), name="companion-embedder-warm-up", daemon=True).start()
    host = args.host or settings.api_host
    port = settings.api_port if args.port is None else args.port
    print(f"companion serve: http://{host}:{port} (OpenAPI at /openapi.json, docs at /docs)", flush=True)
    uvicorn.run(create_app(engine), host=host, port=port, log_level=settings.log_level, access_log=False)
    return 0


def _warm_embedder(engine) -> None:
    """Embed one text, so the model is loaded before the first turn needs it."""
    import structlog

    from errors import CompanionError

    try:
        engine.embedder.embed(["warm-up"])
    except CompanionError as exc:  # a model that cannot load: every turn will say so too
        structlog.get_logger("companion.serve").warning("embedder.warm_up.failed", error=type(exc).__name__)


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
        print(
            "error: add --once to run the close job once now (or use `companion jobs run` for the schedule)",
            file=sys.stderr,
        )
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
    serve.add_argument(
        "--port", type=_port_arg, help="TCP port (default: COMPANION_API_PORT or 8080; 0 picks a free one)"
    )
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
    once.add_argument(
        "--idle-hours", type=_hours_arg, help="idle threshold in hours (default: COMPANION_CLOSE_IDLE_HOURS)"
    )
    once.add_argument("--worker", help="worker id recorded as closed_by (default HOST:PID)")
    once.set_defaults(func=cmd_jobs_close_idle)
