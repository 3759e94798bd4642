"""The job queue: durable jobs in PostgreSQL, run by any number of workers (procrastinate).

Why procrastinate (over pgqueuer, the other well-kept PostgreSQL queue): per-job ``lock``
(jobs sharing it run one at a time, across workers) and ``queueing_lock`` (at most one job
sharing it waits in the queue) are built in, and they are exactly what a session's compaction
needs; sync tasks run in worker threads, which suits our blocking engine; scheduled jobs,
periodic tasks and namespaced task groups (blueprints) come with it; its schema is plain SQL
shipped in the package, applied by our own alembic migration (``0014_job_queue``). pgqueuer is
async-only and has no per-key serialization.

The schema is in the runtime's own database; :func:`build_app` makes the procrastinate
:class:`~procrastinate.App` on it, with the task groups of :data:`BLUEPRINTS`, each under its
namespace. A module adds its own group as a function returning a fresh
:class:`~procrastinate.Blueprint` (procrastinate renames a blueprint's tasks when it is added
to an app, so one instance cannot serve two apps).

The compaction job (``compaction:compact_session``): a turn whose engine has
:class:`QueuedCompaction` defers one after its reply, with ``queueing_lock`` and ``lock`` both
``compaction:<session id>``, so a session has at most one job waiting and its jobs run one at
a time, whichever worker takes them. The job is :meth:`runtime.turn.TurnRunner.compact_now`,
the same code as an inline compaction: under the session's advisory lock and the breaker,
summary validated (verbatim quotes), archive + summary + turn states committed in one
transaction, then profile learning. After a failed summary (counted by the breaker, which
opens at ``COMPANION_BREAKER_THRESHOLD`` failures and then archives verbatim) or a storage
error, the job queues the session's next one with a backoff (:data:`RETRY_SECONDS`). So a turn
pushed out of view is archived (recallable) by the first job that runs after that turn's reply,
or, while the summarizer fails, by the job after the breaker opens (at most
``breaker_threshold`` failed jobs, about 3 + 5 + 9 s apart with the default threshold 3).

Workers: :class:`QueueWorker` runs a procrastinate worker on its own thread and event loop;
``companion serve`` starts one in its lifespan, ``companion jobs run`` runs one next to the
close-idle schedule. Jobs are fetched with ``SELECT … FOR UPDATE SKIP LOCKED``, so any number
of workers on any number of machines share the queue.

A worker killed mid-job (SIGKILL, a lost machine) leaves its job in ``doing``, holding the
session's ``lock``, so no later job of that session would run. Every worker therefore runs
``maintenance:recover_stalled_jobs`` each minute (:class:`QueueWorker`, so ``serve`` and ``jobs run``) (a procrastinate periodic task, one run per
minute across all workers): the ``doing`` jobs of workers whose heartbeat is older than
:data:`STALLED_SECONDS` go back to ``todo`` (procrastinate's documented recipe), or, when a
newer job of the same session already waits (its ``queueing_lock`` is taken), are marked failed
so that job runs instead. A compaction is safe to run again: it commits in one transaction and
re-reads the session under its advisory lock, which the dead connection released.

Events (structlog, ``companion.queue``): ``queue.stalled_job_retried`` / ``queue.stalled_job_dropped``
(job_id, task),  ``queue.job_deferred`` (session_id, job_id),
``queue.job_deduplicated`` (session_id), ``queue.compaction_ran`` (session_id, rolled_turns,
summarized, ok, failures), ``queue.compaction_failed`` (session_id, failures, error class),
``queue.worker_started``, ``queue.worker_stopped``, ``queue.worker_failed``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from typing import Any

import procrastinate
import structlog
from procrastinate import Blueprint, JobContext
from procrastinate.exceptions import AlreadyEnqueued, ProcrastinateException
from sqlalchemy import Engine as SAEngine

from errors import StorageError
from runtime.compaction import CompactionOutcome
from runtime.service._backfill_jobs import embeddings_blueprint
from runtime.service._parse_jobs import parse_blueprint
from runtime.turn import CompactionRequest, CompactNow, Due, Engine

log = structlog.get_logger("companion.queue")

COMPACT_TASK = "compaction:compact_session"
"""The compaction task's full name (namespace ``compaction``)."""

RETRY_SECONDS = (3, 5, 9, 17, 33, 65, 129, 257)
"""After a failed compaction job, the next one of the session runs this many seconds later
(the n-th failure in a row waits the n-th figure); after the last, the next turn queues one."""


def session_lock(session_id: str) -> str:
    """The ``lock`` and ``queueing_lock`` of a session's compaction jobs."""
    return f"compaction:{session_id}"


def compaction_blueprint() -> Blueprint:
    """A fresh task group with ``compact_session``; its jobs need the worker's
    ``additional_context={"engine": Engine}``."""
    blueprint = Blueprint()

    @blueprint.task(name="compact_session", pass_context=True)
    def compact_session(
        context: JobContext,
        *,
        session_id: str,
        user_id: str,
        recent_cap: int,
        summary_cap: int,
        assistant_name: str,
        character_id: str = "",
        failures: int = 0,
    ) -> dict[str, Any]:
        """Compact one session now (see the module docstring). Returns what it did.

        On a failed summary (counted by the breaker) or a storage error, queues the session's
        next job :data:`RETRY_SECONDS` later (``failures`` counts them) and returns. It is a new
        job rather than a procrastinate retry because a retried job would take the
        ``queueing_lock`` back, which a job queued by a newer turn may hold.

        Raises:
            StorageError: the database failed and no next job could be queued.
        """
        engine: Engine = context.additional_context["engine"]
        request = CompactionRequest(
            session_id=session_id,
            user_id=user_id,
            recent_cap=recent_cap,
            summary_cap=summary_cap,
            assistant_name=assistant_name,
            character_id=character_id,
        )
        try:
            outcome = engine.runner.compact_now(request)
        except StorageError as exc:
            log.warning(
                "queue.compaction_failed", session_id=session_id, failures=failures + 1, error=type(exc).__name__
            )
            if not _again(context.app, request, failures):
                raise
            return {"compacted": False, "error": type(exc).__name__}
        log.info(
            "queue.compaction_ran",
            session_id=session_id,
            job_id=context.job.id,
            failures=failures,
            ok=outcome.ok if outcome else None,
            rolled_turns=outcome.rolled_turns if outcome else 0,
            summarized=bool(outcome and outcome.summarized),
        )
        if outcome is not None and not outcome.ok:
            _again(context.app, request, failures)
        return _outcome(outcome)

    return blueprint


def _defer(
    app: procrastinate.App, request: CompactionRequest, *, failures: int = 0, delay: float | None = None
) -> int | None:
    """Queue ``request``'s job; its id, or ``None`` when one of the session is already waiting.

    Raises:
        ProcrastinateException: the job could not be stored.
    """
    lock = session_lock(request.session_id)
    options: dict[str, Any] = {"lock": lock, "queueing_lock": lock}
    if delay is not None:
        options["schedule_in"] = {"seconds": delay}
    try:
        return app.configure_task(COMPACT_TASK, **options).defer(
            session_id=request.session_id,
            user_id=request.user_id,
            recent_cap=request.recent_cap,
            summary_cap=request.summary_cap,
            assistant_name=request.assistant_name,
            character_id=request.character_id,
            failures=failures,
        )
    except AlreadyEnqueued:
        return None


def _again(app: procrastinate.App, request: CompactionRequest, failures: int) -> bool:
    """After a failed job: queue the session's next one :data:`RETRY_SECONDS` later. False when
    the retries are used up or it could not be stored (the next turn queues one then)."""
    if failures >= len(RETRY_SECONDS):
        return False
    try:
        _defer(app, request, failures=failures + 1, delay=RETRY_SECONDS[failures])
    except ProcrastinateException:
        return False
    return True


def _outcome(outcome: CompactionOutcome | None) -> dict[str, Any]:
    if outcome is None:
        return {"compacted": False}
    return {
        "compacted": True,
        "rolled_turns": outcome.rolled_turns,
        "segments": outcome.segments,
        "summarized": outcome.summarized,
    }


STALLED_SECONDS = 30.0
"""A worker whose heartbeat is older than this many seconds is taken for dead (procrastinate's own
default; its workers beat every 10 s)."""


async def recover_stalled_jobs(app: procrastinate.App, *, seconds_since_heartbeat: float = STALLED_SECONDS) -> int:
    """Put the ``doing`` jobs of dead workers back to ``todo``; a job whose ``queueing_lock`` a newer
    waiting job holds is marked failed instead (that job does the same work). Returns how many
    jobs were recovered or dropped."""
    manager = app.job_manager
    done = 0
    for job in await manager.get_stalled_jobs(seconds_since_heartbeat=seconds_since_heartbeat):
        assert job.id is not None
        try:
            await manager.retry_job(job)
            log.warning("queue.stalled_job_retried", job_id=job.id, task=job.task_name)
        except ProcrastinateException:  # the queueing lock is taken by a newer waiting job
            await manager.finish_job_by_id_async(job.id, status=procrastinate.jobs.Status.FAILED, delete_job=False)
            log.warning("queue.stalled_job_dropped", job_id=job.id, task=job.task_name)
        done += 1
    return done


def maintenance_blueprint() -> Blueprint:
    """A fresh task group with the periodic ``recover_stalled_jobs`` (each minute)."""
    blueprint = Blueprint()

    @blueprint.periodic(cron="* * * * *")
    @blueprint.task(name="recover_stalled_jobs", queueing_lock="maintenance:recover_stalled_jobs", pass_context=True)
    async def recover(context: JobContext, timestamp: int) -> int:
        return await recover_stalled_jobs(context.app)

    return blueprint


BLUEPRINTS: dict[str, Callable[[], Blueprint]] = {
    "compaction": compaction_blueprint,
    "parse": parse_blueprint,
    "embeddings": embeddings_blueprint,
}
"""Namespace → a function returning that namespace's fresh task group. Add a group here.
Long-running workers (:class:`QueueWorker`) add ``maintenance`` (:func:`maintenance_blueprint`)."""


def conninfo(engine: SAEngine) -> str:
    """A libpq connection string for the database ``engine`` is connected to (password included)."""
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


def build_app(
    database: SAEngine | str,
    *,
    sync: bool = False,
    blueprints: Mapping[str, Callable[[], Blueprint]] | None = None,
) -> procrastinate.App:
    """The procrastinate app on the runtime's database, not yet opened.

    Args:
        database: the runtime's SQLAlchemy engine, or a libpq connection string.
        sync: ``True`` for an app that only defers jobs from threads (a psycopg sync pool;
            open it with ``app.open()``); ``False`` for one a worker runs (an async pool).
        blueprints: namespace → task-group factory; default :data:`BLUEPRINTS`.
    """
    info = database if isinstance(database, str) else conninfo(database)
    connector: procrastinate.BaseConnector
    if sync:
        connector = procrastinate.SyncPsycopgConnector(conninfo=info, min_size=1, max_size=4)
    else:
        connector = procrastinate.PsycopgConnector(conninfo=info, min_size=1, max_size=4)
    app = procrastinate.App(connector=connector)
    for namespace, factory in (BLUEPRINTS if blueprints is None else blueprints).items():
        app.add_tasks_from(factory(), namespace=namespace)
    return app


class QueuedCompaction:
    """Defers each compaction as a ``compaction:compact_session`` job (one waiting per session).

    Owns a sync procrastinate app (a small psycopg pool) on the runtime's database; :meth:`close`
    closes it. Deferring is one ``INSERT``; the reply does not wait for the compaction.
    """

    name = "queue"

    def __init__(self, database: SAEngine | str) -> None:
        self.app = build_app(database, sync=True, blueprints={})
        self.app.open()

    def schedule(self, request: CompactionRequest, run: CompactNow, due: Due) -> CompactionOutcome | None:
        """Defer the job when ``due`` says the session is over its cap; ``None`` always. A job of
        the session already waiting covers this one.

        Raises:
            StorageError: the job could not be stored.
        """
        if due(request):
            self.defer(request)
        return None

    def defer(self, request: CompactionRequest) -> int | None:
        """Queue ``request``'s job now: its id, or ``None`` when one of the session is already waiting.

        Raises:
            StorageError: the job could not be stored.
        """
        try:
            job_id = _defer(self.app, request)
        except ProcrastinateException as exc:
            raise StorageError(
                f"The compaction job of session {request.session_id!r} could not be queued ({type(exc).__name__}).",
                session_id=request.session_id,
            ) from exc
        if job_id is None:
            log.debug("queue.job_deduplicated", session_id=request.session_id)
        else:
            log.debug("queue.job_deferred", session_id=request.session_id, job_id=job_id)
        return job_id

    def close(self) -> None:
        self.app.close()


class QueueWorker:
    """A procrastinate worker on its own thread and event loop, for an engine's jobs.

    :meth:`start` returns once the thread runs; :meth:`stop` asks the worker to stop, lets the
    job in progress finish (up to ``graceful_seconds``), and joins the thread. Sync tasks run in
    the worker's threads (``concurrency`` at a time); a session's jobs never overlap (``lock``).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        name: str = "companion",
        concurrency: int = 2,
        graceful_seconds: float = 60.0,
        poll_seconds: float = 5.0,
    ) -> None:
        self.engine = engine
        self.name = name
        self.concurrency = concurrency
        self.graceful_seconds = graceful_seconds
        self.poll_seconds = poll_seconds
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> QueueWorker:
        self._thread = threading.Thread(target=self._run, name=f"queue-worker-{self.name}", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self.error is not None:
            raise StorageError(f"The queue worker could not start ({type(self.error).__name__}).") from self.error
        log.info("queue.worker_started", worker=self.name, concurrency=self.concurrency)
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 -- kept for start() to raise; the thread must not die silently
            self.error = exc
            log.error("queue.worker_failed", worker=self.name, error=type(exc).__name__, exc_info=exc)
            self._ready.set()

    async def _main(self) -> None:
        app = build_app(self.engine.store.conninfo(), blueprints={**BLUEPRINTS, "maintenance": maintenance_blueprint})
        async with app.open_async():
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.create_task(
                app.run_worker_async(
                    name=self.name,
                    concurrency=self.concurrency,
                    install_signal_handlers=False,
                    shutdown_graceful_timeout=self.graceful_seconds,
                    fetch_job_polling_interval=self.poll_seconds,
                    delete_jobs="successful",
                    additional_context={"engine": self.engine},
                )
            )
            self._ready.set()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def stop(self) -> None:
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        if self._thread is not None:
            self._thread.join(self.graceful_seconds + 10)
        log.info("queue.worker_stopped", worker=self.name)

    def __enter__(self) -> QueueWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def drain(engine: Engine, *, concurrency: int = 1, name: str = "drain") -> None:
    """Run the queue's jobs until none is left to take now, then return (tests, scripts, and a
    one-shot ``companion jobs run --once``)."""
    app = build_app(engine.store.conninfo())

    async def main() -> None:
        async with app.open_async():
            await app.run_worker_async(
                name=name,
                concurrency=concurrency,
                wait=False,
                install_signal_handlers=False,
                listen_notify=False,
                delete_jobs="successful",
                additional_context={"engine": engine},
            )

    asyncio.run(main())
