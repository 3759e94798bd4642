"""``companion serve``, ``companion apps`` and ``companion jobs``: the HTTP service, app keys, the close job."""

from __future__ import annotations

import argparse
import sys

from runtime.cli._common import EXIT_USAGE, _hours_arg, _port_arg, _settings


# -- the HTTP service, apps and the close job --------------------------------------
def _workers_arg(value: str) -> int:
    try:
        workers = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers must be a whole number, got {value!r}") from None
    if not 1 <= workers <= 64:
        raise argparse.ArgumentTypeError(f"--workers must be between 1 and 64, got {workers}")
    return workers


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve the HTTP API under uvicorn until Ctrl-C: one process with one engine, or with
    ``--workers N``, N worker processes that each open their own engine on one database."""
    settings = _settings(database=True)

    import uvicorn

    service = settings.service
    host = args.host or service.api_host
    port = service.api_port if args.port is None else args.port
    if port == 0:  # pick the port here, so the address printed below is the one served
        port = _free_port(host)
    from runtime.service import supervise

    if args.workers > 1:
        _prepare_workers(settings)
        supervise(settings)  # this process owns the embedded server while the workers run
        print(
            f"companion serve: http://{host}:{port} (OpenAPI at /openapi.json, docs at /docs), "
            f"{args.workers} worker processes",
            flush=True,
        )
        factory = "app_from_env_without_worker" if args.no_worker else "app_from_env"
        uvicorn.run(
            f"runtime.service.api.app:{factory}",
            factory=True,
            workers=args.workers,
            host=host,
            port=port,
            log_level=settings.log_level,
            access_log=False,
        )
        return 0
    from runtime.service import open_engine
    from runtime.service.api import create_app
    from runtime.service.api.app import warm_embedder

    # the reply never waits for a summary, an upload never for its parse: both are queue jobs
    engine = open_engine(settings, compaction="queue", parsing="queue")
    supervise(settings)
    warm_embedder(engine)
    print(f"companion serve: http://{host}:{port} (OpenAPI at /openapi.json, docs at /docs)", flush=True)
    app = create_app(engine, job_worker=not args.no_worker, owns_engine=True)
    uvicorn.run(app, host=host, port=port, log_level=settings.log_level, access_log=False)
    return 0


def _prepare_workers(settings) -> None:
    """Before worker processes start: start the embedded database if ``DATABASE_URL`` is unset
    (this process owns it while the workers run) and migrate it, then hand its URL to the workers
    through ``DATABASE_URL``. A ``DATABASE_URL`` database must be at head already."""
    import os

    from memory.database import current_revision, head_revision, require_schema, upgrade
    from runtime.service import connect

    database = connect(settings)
    if database.embedded:
        if current_revision(database.engine) != head_revision():
            from memory.embeddings import SentenceTransformerEmbedder

            upgrade(database.engine, embedding_dim=SentenceTransformerEmbedder(settings.embedding_model).dimension)
        os.environ["DATABASE_URL"] = database.url
    require_schema(database.engine)
    database.engine.dispose()


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


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
    from runtime.service import QueueWorker, drain, run_scheduler, supervise

    settings, engine = _job_engine()
    if not args.once:
        supervise(settings)
    if args.once:
        drain(engine, name=args.worker or "jobs-once")
        print("companion jobs run --once: the queue had no more jobs to take")
        return 0
    print(
        f"companion jobs run: running queued jobs (compaction, parses) and closing sessions idle for "
        f"{settings.service.close_idle_hours:g} h on cron {settings.service.close_cron!r} (local time); Ctrl-C stops.",
        flush=True,
    )
    run_scheduler(
        engine,
        cron=settings.service.close_cron,
        idle_seconds=settings.service.close_idle_hours * 3600,
        batch=settings.service.close_batch,
        worker_id=args.worker,
        alongside=QueueWorker(engine, name=args.worker or "jobs", concurrency=args.concurrency),
        retention_days=settings.service.retention_days,
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
    service = settings.service
    hours = service.close_idle_hours if args.idle_hours is None else args.idle_hours
    report = close_idle_sessions(
        engine,
        idle_seconds=hours * 3600,
        worker_id=args.worker,
        batch=service.close_batch,
        retention_days=service.retention_days,
    )
    print(
        f"close-idle ({report.worker_id}, idle > {hours:g} h): claimed {report.claimed}, "
        f"closed {len(report.closed)}, failed {len(report.failed)}, turns rolled out {report.rolled_turns}"
        + (f", expired sessions deleted {report.expired}" if service.retention_days else "")
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
    serve.add_argument(
        "--workers",
        type=_workers_arg,
        default=1,
        help="worker processes, each with its own engine, sharing the port and the database (default 1)",
    )
    serve.add_argument(
        "--no-worker",
        action="store_true",
        help="run no queue worker in this process (compaction jobs wait for `companion jobs run`)",
    )
    serve.set_defaults(func=cmd_serve)

    apps = sub.add_parser("apps", help="client apps and their API keys")
    a_sub = apps.add_subparsers(dest="apps_command", required=True)
    create = a_sub.add_parser("create", help="create an app and print its API key (once)")
    create.add_argument("name")
    create.set_defaults(func=cmd_apps_create)
    a_sub.add_parser("list", help="list the apps (never their keys)").set_defaults(func=cmd_apps_list)

    jobs = sub.add_parser("jobs", help="the job queue worker and the session-close job")
    j_sub = jobs.add_subparsers(dest="jobs_command", required=True)
    run = j_sub.add_parser(
        "run", help="run queued jobs (compaction, parses) and the close job on COMPANION_CLOSE_CRON until Ctrl-C"
    )
    run.add_argument("--worker", help="worker id recorded as closed_by and the queue worker's name (default HOST:PID)")
    run.add_argument("--concurrency", type=int, default=2, help="queued jobs run at once (default 2)")
    run.add_argument("--once", action="store_true", help="run the queued jobs there are now, then exit")
    run.set_defaults(func=cmd_jobs_run)
    once = j_sub.add_parser("close-idle", help="close idle sessions now")
    once.add_argument("--once", action="store_true", help="run once and exit (for cron or tests)")
    once.add_argument(
        "--idle-hours", type=_hours_arg, help="idle threshold in hours (default: COMPANION_CLOSE_IDLE_HOURS)"
    )
    once.add_argument("--worker", help="worker id recorded as closed_by (default HOST:PID)")
    once.set_defaults(func=cmd_jobs_close_idle)
