"""structlog configuration: events with stable names and ids, never whole messages at info.

Event names used by the runtime: ``turn.completed``, ``turn.reply_failed``,
``compaction.completed``, ``compaction.failed``, ``compaction.archived_only``,
``compaction.skipped``, ``summary.quotes_dropped``, ``breaker.opened``,
``breaker.half_open``, ``breaker.closed``, ``breaker.reopened``,
``breaker.failures_cleared``, ``breaker.reset`` (see ``runtime/compaction.py``);
``job.session_closed``, ``job.session_failed``, ``job.run_completed``,
``job.scheduler_started``, ``job.scheduler_stopping``, ``job.scheduler_stopped``
(``runtime/jobs.py``); ``queue.job_deferred``, ``queue.job_deduplicated``,
``queue.compaction_ran``, ``queue.compaction_failed``, ``queue.worker_started``,
``queue.worker_stopped`` (``runtime/service/_queue.py``); ``api.error``, ``api.unexpected_error`` (``runtime/api/errors.py``).
"""

from __future__ import annotations

import logging
import sys

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(level: str = "warning", fmt: str = "console") -> None:
    """Configure structlog to write to stderr at ``level`` as ``console`` text or ``json`` lines."""
    renderer = structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # sys.stderr is looked up per logger, not once here: a stream replaced since (a test's
        # capture, a daemon's redirect) is written to, never one that has been closed.
        # WriteLogger writes a line and its newline in one write: PrintLogger's print() writes
        # them apart, so the processes of `serve --workers N` glued each other's lines together.
        logger_factory=lambda *_: structlog.WriteLogger(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
