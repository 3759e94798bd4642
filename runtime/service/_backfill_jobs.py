"""The embeddings backfill as a job of the queue (:mod:`runtime.service._queue`).

In ``companion serve`` (and any engine with queued compaction), a turn or compaction that stored
something without its vector (the embedder was down) defers ``embeddings:backfill`` with
``queueing_lock`` and ``lock`` ``embeddings:backfill``: at most one waits, and one runs at a
time across workers. The job is :meth:`runtime.turn.Backfiller.run` in the worker's engine.
While the embedder is still down it is retried (:data:`BACKFILL_RETRY`); besides, every
worker's ``embeddings:sweep`` (every ten minutes, one run across workers) counts what is
missing and runs the backfill when anything is, so nothing stays unembedded after the retries
or a restart.

Events (structlog, ``companion.queue``): ``queue.backfill_deferred`` (job_id),
``queue.backfill_ran`` (turn_vectors, archive_keys).
"""

from __future__ import annotations

from typing import Any

import procrastinate
import structlog
from procrastinate import Blueprint, JobContext, RetryStrategy
from procrastinate.exceptions import AlreadyEnqueued, ProcrastinateException

from errors import EmbedderUnavailableError, StorageError
from runtime.turn import Engine

log = structlog.get_logger("companion.queue")

BACKFILL_TASK = "embeddings:backfill"
"""The backfill task's full name (namespace ``embeddings``)."""
BACKFILL_LOCK = "embeddings:backfill"
BACKFILL_RETRY = RetryStrategy(
    max_attempts=12, wait=30, linear_wait=30, retry_exceptions={EmbedderUnavailableError, StorageError}
)
"""While the embedder is down (or the database fails) the job runs again ``30 + 30 × attempts``
seconds later, 12 more times (about 40 minutes in all); the sweep goes on after that."""


def embeddings_blueprint() -> Blueprint:
    """A fresh task group with ``backfill`` and the periodic ``sweep``; their jobs need the
    worker's ``additional_context={"engine": Engine}``."""
    blueprint = Blueprint()

    @blueprint.task(name="backfill", pass_context=True, retry=BACKFILL_RETRY, lock=BACKFILL_LOCK)
    def backfill(context: JobContext) -> dict[str, Any]:
        """Make the missing vectors now. Returns what it wrote.

        Raises:
            EmbedderUnavailableError: still down (the job is retried).
            StorageError: the database failed (the job is retried).
        """
        engine: Engine = context.additional_context["engine"]
        done = engine.backfiller.run()
        log.info("queue.backfill_ran", turn_vectors=done.turn_vectors, archive_keys=done.archive_keys)
        return {"turn_vectors": done.turn_vectors, "archive_keys": done.archive_keys}

    @blueprint.periodic(cron="*/10 * * * *")
    @blueprint.task(name="sweep", queueing_lock="embeddings:sweep", pass_context=True)
    def sweep(context: JobContext, timestamp: int) -> int:
        """Defer a backfill when anything is missing; how many rows are."""
        engine: Engine = context.additional_context["engine"]
        left = engine.backfiller.missing().total
        if left:
            _defer(context.app)
        return left

    return blueprint


def _defer(app: procrastinate.App) -> int | None:
    """Queue a backfill; its id, or ``None`` when one already waits."""
    try:
        return app.configure_task(BACKFILL_TASK, queueing_lock=BACKFILL_LOCK).defer()
    except AlreadyEnqueued:
        return None


class QueuedBackfill:
    """A :class:`~runtime.turn.BackfillScheduler` that defers ``embeddings:backfill`` on ``app``
    (a sync procrastinate app the caller owns and closes, e.g. :class:`~runtime.service.QueuedCompaction`'s)."""

    name = "queue"

    def __init__(self, app: procrastinate.App) -> None:
        self.app = app

    def request(self) -> None:
        """Defer a backfill (one waiting covers every request). A job that cannot be stored is
        logged, not raised: the sweep finds the rows later."""
        try:
            job_id = _defer(self.app)
        except ProcrastinateException as exc:
            log.warning("queue.backfill_not_deferred", error=type(exc).__name__)
            return
        if job_id is not None:
            log.info("queue.backfill_deferred", job_id=job_id)
