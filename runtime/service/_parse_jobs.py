"""Parse jobs: the parse of a stored file as a durable job of the queue (:mod:`runtime.service._queue`).

An upload in ``companion serve`` stores the bytes and defers ``parse:parse_file`` with
``queueing_lock`` ``parse:<file id>`` (at most one job per file waits). Any queue worker takes
it: the in-process worker of any ``companion serve``, or ``companion jobs run``. The job is
:meth:`runtime.files.ParseService.submit` in the worker's engine, with every rule of a parse
in the background: the claim in the ``files`` row (one claimant wins across processes), the
capped subprocess (pebble, CPU, memory and wall-time limits), per-user fairness, and
``parse_attempts``. The job waits for the parse and returns its final state.

A job whose file is already parsed, or claimed by another process, ends at once. A job whose
database failed under the parse gives the claim back (``pending``) and runs again later.

Events (structlog, ``companion.queue``): ``queue.parse_deferred`` (file_id, job_id),
``queue.parse_ran`` (file_id, state).
"""

from __future__ import annotations

import contextlib
from typing import Any

import structlog
from procrastinate import Blueprint, JobContext, RetryStrategy
from procrastinate.exceptions import AlreadyEnqueued, ProcrastinateException
from sqlalchemy import Engine as SAEngine

from errors import StorageError
from runtime.turn import Engine

log = structlog.get_logger("companion.queue")

PARSE_TASK = "parse:parse_file"
"""The parse task's full name (namespace ``parse``)."""

PARSE_RETRY = RetryStrategy(max_attempts=5, wait=2, exponential_wait=2, retry_exceptions={StorageError})
"""A parse job whose database failed runs again after ``2 + 2 ** (attempts + 1)`` seconds, up to 5 more times."""


def file_lock(file_id: str) -> str:
    """The ``queueing_lock`` of a file's parse jobs."""
    return f"parse:{file_id}"


def parse_blueprint() -> Blueprint:
    """A fresh task group with ``parse_file``; its jobs need the worker's
    ``additional_context={"engine": Engine}`` with file services."""
    blueprint = Blueprint()

    @blueprint.task(name="parse_file", pass_context=True, retry=PARSE_RETRY)
    def parse_file(context: JobContext, *, file_id: str) -> dict[str, Any]:
        """Parse one stored file in this worker (see the module docstring). Returns its state.

        Raises:
            StorageError: the database failed (the claim is given back; the job is retried).
        """
        engine: Engine = context.additional_context["engine"]
        services = engine.file_services
        if services is None:
            raise StorageError("This worker's engine has no file services; it cannot run parse jobs.")
        future = services.parses.submit(file_id)
        if future is None:  # parsed already, deleted, or another process holds the claim
            return {"parsed": False}
        try:
            state = future.result()
        except Exception as exc:
            with contextlib.suppress(StorageError):
                services.files.set_parse_result(file_id, state="pending")
            raise StorageError(
                f"The parse of file {file_id!r} stopped on a database error ({type(exc).__name__}); it runs again."
            ) from exc
        log.info("queue.parse_ran", file_id=file_id, job_id=context.job.id, state=state)
        return {"parsed": True, "state": state}

    return blueprint


class QueuedParses:
    """Defers each parse as a ``parse:parse_file`` job (a :class:`runtime.files.ParseQueue`).

    Owns a sync procrastinate app (a small psycopg pool) on the runtime's database; :meth:`close`
    closes it. Deferring is one ``INSERT``.
    """

    def __init__(self, database: SAEngine | str) -> None:
        from runtime.service._queue import build_app

        self.app = build_app(database, sync=True, blueprints={})
        self.app.open()

    def defer(self, file_id: str) -> None:
        """Queue the parse of ``file_id``; a job of the file already waiting covers this one.

        Raises:
            StorageError: the job could not be stored.
        """
        lock = file_lock(file_id)
        try:
            job_id = self.app.configure_task(PARSE_TASK, queueing_lock=lock).defer(file_id=file_id)
        except AlreadyEnqueued:
            return
        except ProcrastinateException as exc:
            raise StorageError(
                f"The parse job of file {file_id!r} could not be queued ({type(exc).__name__})."
            ) from exc
        log.info("queue.parse_deferred", file_id=file_id, job_id=job_id)

    def close(self) -> None:
        self.app.close()


__all__ = ["PARSE_TASK", "QueuedParses", "parse_blueprint"]
