"""Closing sessions: the nightly close job, and closing one session on request.

A session is *idle* when its ``last_activity_at`` (wall-clock time of its newest stored
turn, or of its creation) is older than the idle threshold (``COMPANION_CLOSE_IDLE_HOURS``,
default 6 hours). :func:`close_idle_sessions` closes idle sessions in batches:

1. **Claim** up to ``batch`` idle open sessions in one transaction with
   ``SELECT … FOR NO KEY UPDATE SKIP LOCKED``. Rows another worker holds are skipped,
   and a row another worker closed meanwhile fails the re-checked ``closed_at IS NULL``,
   so no session is processed twice, whether the workers are threads or processes.
   ``NO KEY UPDATE`` is the ``FOR UPDATE`` variant that still lets the compaction's own
   inserts (archive segments, summary: foreign keys to the session, which take
   ``FOR KEY SHARE``) proceed on other connections; a plain ``FOR UPDATE`` would make the
   worker wait on itself. A turn arriving meanwhile waits on the row lock, then finds
   the session closed (:class:`~errors.SessionClosedError`).
2. **Roll out** everything left in each session's recent window into the summary and the
   archive (:meth:`~runtime.compaction.Compactor.roll_out_all`, under the breaker rules:
   breaker open → archived only; a failed summary is counted and the turns archived).
3. **Close**: set ``closed_at``/``closed_by`` and commit the batch; the locks go with it.

A session whose roll-out fails (database error, or a live compaction holding its lock)
stays open and is not claimed again in the same run; the next run retries it.
:func:`run_scheduler` runs the job on a cron schedule (APScheduler 3.x).

Events (structlog, ``companion.jobs``): ``job.session_closed`` (session_id, worker,
rolled_turns, segments, summarized, breaker_state), ``job.session_failed`` (session_id,
worker, error), ``job.run_completed`` (worker, claimed, closed, failed, idle_seconds).
"""

from __future__ import annotations

import contextlib
import os
import socket
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog

from errors import CompanionError
from memory.tables import utcnow
from runtime.compaction import CompactionOutcome
from runtime.turn import Engine

log = structlog.get_logger("companion.jobs")


def default_worker_id() -> str:
    """``HOST:PID``, naming the process that closed a session."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(kw_only=True)
class CloseReport:
    """What one run of the close job did."""

    worker_id: str
    claimed: int = 0
    """Sessions claimed (closed plus failed)."""
    closed: list[str] = field(default_factory=list)
    """Ids of the sessions this run closed."""
    failed: dict[str, str] = field(default_factory=dict)
    """Session id → why it could not be closed (it stays open)."""
    rolled_turns: int = 0
    """Turns rolled out of recent windows into the summary and/or the archive."""
    expired: int = 0
    """Closed sessions deleted for being older than the retention (``COMPANION_RETENTION_DAYS``)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "worker": self.worker_id,
            "claimed": self.claimed,
            "closed": len(self.closed),
            "failed": len(self.failed),
            "rolled_turns": self.rolled_turns,
            "expired": self.expired,
            "failures": dict(self.failed),
        }


def _roll_out(engine: Engine, session_id: str, user_id: str, character_id: str) -> CompactionOutcome | None:
    return engine.compactor.roll_out_all(
        session_id=session_id,
        user_id=user_id,
        recent_cap=engine.budgets.recent,
        summary_cap=engine.budgets.summary,
        assistant_name=engine.cast.newest(character_id).persona.name,
    )


def _log_closed(engine: Engine, session_id: str, worker: str, outcome: CompactionOutcome | None) -> None:
    log.info(
        "job.session_closed",
        session_id=session_id,
        worker=worker,
        rolled_turns=outcome.rolled_turns if outcome else 0,
        segments=outcome.segments if outcome else 0,
        summarized=bool(outcome and outcome.summarized),
        breaker_state=engine.compactor.breaker_state(engine.store.compaction.state(session_id)),
    )


def close_idle_sessions(
    engine: Engine,
    *,
    idle_seconds: float,
    now: datetime | None = None,
    worker_id: str | None = None,
    batch: int = 20,
    limit: int | None = None,
    retention_days: float | None = None,
) -> CloseReport:
    """Close every session idle for more than ``idle_seconds`` (see the module docstring).

    Args:
        engine: its store's database, compactor and budgets are used (no model call
            unless ``COMPANION_SUMMARIZER=model``).
        idle_seconds: idleness threshold, seconds.
        now: the time idleness is measured from (default: now); tests move it.
        worker_id: recorded as ``closed_by`` (default ``HOST:PID``).
        batch: sessions claimed (and locked) per transaction.
        limit: stop after claiming this many sessions (default: until none is left).
        retention_days: then delete every session closed more than this many days before ``now``,
            with everything of it (``COMPANION_RETENTION_DAYS``; ``None``: keep them).

    Raises:
        StorageError: the claim or the close itself failed (that batch is rolled back;
            roll-outs already committed stay, and the next run finds nothing left to roll out).
    """
    worker = worker_id or default_worker_id()
    cutoff = (now or utcnow()) - timedelta(seconds=idle_seconds)
    report = CloseReport(worker_id=worker)
    while limit is None or report.claimed < limit:
        size = batch if limit is None else min(batch, limit - report.claimed)
        with engine.store.sessions.idle_batch(
            cutoff=cutoff, skip=list(report.failed), limit=size, lease_seconds=engine.settings.turn_lease_seconds
        ) as idle:
            if not idle.sessions:
                break
            report.claimed += len(idle.sessions)
            for session in idle.sessions:
                session_id = session.session_id
                try:
                    outcome = _roll_out(engine, session_id, session.user_id, session.character_id)
                except CompanionError as exc:
                    outcome = CompactionOutcome(session_id=session_id, ok=False, error=f"{type(exc).__name__}: {exc}")
                if outcome is not None and not outcome.ok:
                    report.failed[session_id] = outcome.error or "failed"
                    log.warning(
                        "job.session_failed", session_id=session_id, worker=worker, error=(outcome.error or "")[:300]
                    )
                    continue
                idle.close(session_id, by=worker)
                report.closed.append(session_id)
                report.rolled_turns += outcome.rolled_turns if outcome else 0
                _log_closed(engine, session_id, worker, outcome)
    if retention_days:
        expired = engine.store.sessions.closed_before((now or utcnow()) - timedelta(days=retention_days))
        for session_id, user_id in expired:
            engine.delete_session(user_id=user_id, session_id=session_id)
        report.expired = len(expired)
    log.info(
        "job.run_completed",
        worker=worker,
        claimed=report.claimed,
        closed=len(report.closed),
        failed=len(report.failed),
        expired=report.expired,
        idle_seconds=idle_seconds,
    )
    return report


def close_session(engine: Engine, session_id: str, *, closed_by: str = "api") -> CompactionOutcome | None:
    """Close one session now, idle or not: roll out what is left, then mark it closed.

    Waits for a close job holding the session, and (up to ``COMPANION_TURN_WAIT_SECONDS``)
    for a running turn to end; returns the roll-out (``None`` if there was nothing to roll out).

    Raises:
        NotFoundError: no such session.
        SessionClosedError: it was closed already.
        TurnInProgressError: a turn of the session is still running; nothing changed.
        ConflictError: the roll-out could not run (a compaction of the session holds its lock);
            the session stays open.
        StorageError: the database failed; the session stays open.
    """
    from errors import ConflictError

    # the same rule as turns: wait (COMPANION_TURN_WAIT_SECONDS) for a running turn, then refuse
    with (
        engine.claim(session_id) as claim,
        engine.store.sessions.locked_for_close(
            session_id, owner=claim.owner, lease_seconds=engine.settings.turn_lease_seconds
        ) as locked,
    ):
        outcome = _roll_out(engine, session_id, locked.session.user_id, locked.session.character_id)
        if outcome is not None and not outcome.ok:
            raise ConflictError(f"Session {session_id!r} could not be closed now ({outcome.error}); try again shortly.")
        locked.close(by=closed_by)
    _log_closed(engine, session_id, closed_by, outcome)
    return outcome


def run_scheduler(
    engine: Engine,
    *,
    cron: str,
    idle_seconds: float,
    batch: int,
    worker_id: str | None = None,
    alongside: AbstractContextManager[Any] | None = None,
    retention_days: float | None = None,
) -> None:
    """Run :func:`close_idle_sessions` on the ``cron`` schedule (five crontab fields, the
    machine's local time zone) until Ctrl-C or SIGTERM. Blocks; on the signal a close in
    progress finishes first.

    One run at a time (``max_instances=1``); runs missed while the process was busy
    are folded into one (``coalesce``). APScheduler 3.x numbers weekdays from Monday = 0
    in crontab expressions (its documented difference from cron, where 0 is Sunday);
    use names (``mon``–``sun``) to be safe.

    ``alongside`` (e.g. a :class:`~runtime.service.QueueWorker`) is entered once the scheduler
    runs and exited before it shuts down.
    """
    import signal
    import threading

    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.triggers.cron import CronTrigger
    from tzlocal import get_localzone

    zone = get_localzone()
    scheduler = BackgroundScheduler(timezone=zone)
    scheduler.add_job(
        close_idle_sessions,
        CronTrigger.from_crontab(cron, timezone=zone),
        kwargs={
            "engine": engine,
            "idle_seconds": idle_seconds,
            "batch": batch,
            "worker_id": worker_id,
            "retention_days": retention_days,
        },
        id="close-idle",
        max_instances=1,
        coalesce=True,
        misfire_grace_time=3600,
    )
    stopping = threading.Event()
    received: list[str] = []

    def stop(signum, frame) -> None:  # Ctrl-C or SIGTERM: only wake the main thread; it shuts down.
        # No logging here: the handler runs between two bytecodes of the main thread, which
        # may hold structlog's (non-reentrant) write lock at that moment; logging would deadlock.
        received.append(signal.Signals(signum).name)
        stopping.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
    # the scheduler runs in its own thread; a signal at any moment (even before it is
    # running) only sets the event, so there is no window in which Ctrl-C is lost
    scheduler.start()
    log.info("job.scheduler_started", cron=cron, timezone=str(zone), idle_seconds=idle_seconds, batch=batch)
    try:
        with alongside if alongside is not None else contextlib.nullcontext():
            while not stopping.wait(1.0):
                pass
        log.info("job.scheduler_stopping", signal=received[0] if received else None)
    except KeyboardInterrupt:
        pass
    finally:
        scheduler.shutdown(wait=True)  # a close in progress finishes its batch (it commits per session)
        log.info("job.scheduler_stopped")
