"""Background parsing of stored files, and shared waits on a parse.

:meth:`ParseService.submit` claims a ``pending`` file in the database (one claimant
wins across threads and processes) and parses it on a small thread pool; the result
(``ready``, ``empty``, ``needs_ocr`` or ``failed`` with a message) is written in one
update. A parse is never started twice for one file.

Waiting: every caller interested in one file (a preview, the model's ``file_read``,
a warm-up) gets its own :class:`WaitHandle` from :meth:`ParseService.watch`, but all
handles on one file share ONE watch: a single thread that wakes when this process's
parse finishes and otherwise polls the file's state every ``poll_seconds`` (so a parse
running in another process is seen too). ``handle.cancel()`` withdraws only that
caller's interest; when the last handle on a file is cancelled the watch stops.

Budget and fairness: with the default parser, each parse runs in its own subprocess
(a ``pebble`` process pool, one task per process) capped at ``cpu_seconds`` of CPU,
``memory_bytes`` of address space and twice the CPU time of wall time, at a lower
priority than the service; a file past a cap fails (``failed``, reason ``too_large``
or ``too_slow``) and the service is untouched. Parses wait in one queue per user,
served round-robin, and one user runs at most ``workers - 1`` parses at once (one
with a single worker), even when the other workers are idle: a worker is always free
for the next user, so one user's hostile files never hold every worker.
A file whose parser dies without a result twice is marked ``failed``
(:meth:`~memory.files.FileStore.claim_parse`), so it cannot kill parsers after every restart.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from errors import FileError, FileParseError, StorageError
from memory.database import UntilStorageAnswers
from memory.files import FileStore
from memory.tables import FINAL_PARSE_STATES, ParseState
from runtime.parsing import Extract, ParseLimits, parse_document, serialize

log = structlog.get_logger("companion.files")

DEFAULT_PARSE_CPU_SECONDS = 60.0
"""``COMPANION_PARSE_CPU_SECONDS`` default: CPU time one parse may use, seconds."""
DEFAULT_PARSE_MEMORY_BYTES = 1024 * 1024 * 1024
"""``COMPANION_PARSE_MEMORY_MB`` default: address space of one parse subprocess, bytes (1 GiB)."""


class ParseQueue(Protocol):
    """Where parses are sent when they run as durable jobs (``runtime.service.QueuedParses``):
    any worker of the queue runs :meth:`ParseService.submit` for the file."""

    def defer(self, file_id: str) -> None:
        """Queue the parse of ``file_id`` (at most one job waits per file).

        Raises:
            StorageError: the job could not be stored.
        """
        ...

    def close(self) -> None: ...


RESUME_SECONDS = (0.5, 5.0)
"""A parse aborted by a storage outage is tried again after this many seconds, then at most this
many apart (doubling), until the database answers."""


class Parser(Protocol):
    """Turns bytes into an :class:`~runtime.parsing.Extract`; raises ``FileParseError`` on bad input."""

    def __call__(self, data: bytes, *, name: str, mime: str | None, limits: ParseLimits) -> Extract: ...


def default_parser(data: bytes, *, name: str, mime: str | None, limits: ParseLimits) -> Extract:
    """:func:`runtime.parsing.parse_document`."""
    return parse_document(data, name=name, mime=mime, limits=limits)


@dataclass(eq=False)
class _Watch:
    file_id: str
    waiters: int = 0
    state: str | None = None
    """The last state seen (``None``: the file is gone)."""
    done: threading.Event = field(default_factory=threading.Event)
    wake: threading.Event = field(default_factory=threading.Event)
    stopped: bool = False
    thread: threading.Thread | None = None


class WaitHandle:
    """One caller's interest in one file's parse. Cancel it when done (or use ``with``)."""

    def __init__(self, service: ParseService, watch: _Watch) -> None:
        self._service = service
        self._watch = watch
        self._cancelled = False

    @property
    def file_id(self) -> str:
        return self._watch.file_id

    def wait(self, timeout: float) -> str | None:
        """Block up to ``timeout`` seconds for the parse to end.

        Returns:
            The final state (``ready``, ``empty``, ``needs_ocr``, ``failed``) if it ended,
            else the last state seen (``pending`` or ``parsing``); ``None`` if the file
            was deleted. A cancelled handle returns the last state at once.
        """
        if not self._cancelled:
            self._watch.done.wait(max(0.0, timeout))
        return self._watch.state

    @property
    def done(self) -> bool:
        return self._watch.done.is_set()

    def cancel(self) -> None:
        """Withdraw this caller's interest (idempotent). Other handles keep waiting; the
        shared watch stops when the last handle is cancelled."""
        if not self._cancelled:
            self._cancelled = True
            self._service._release(self._watch)

    def __enter__(self) -> WaitHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


class ParseService:
    """Parses stored files in the background and lets callers wait on them.

    Args:
        files: the file store (reads blobs, claims parses, writes results).
        parser: the parse function (default :func:`default_parser`); tests pass a counting one.
        limits: bounds on one parse (ZIP depth, unpacked size).
        workers: parser threads.
        poll_seconds: how often a watch re-reads the state of a parse it cannot see finish
            (one running in another process), seconds.
    """

    def __init__(
        self,
        files: FileStore,
        *,
        parser: Parser | Callable[..., Extract] = default_parser,
        limits: ParseLimits | None = None,
        workers: int = 2,
        poll_seconds: float = 0.1,
        cpu_seconds: float | None = DEFAULT_PARSE_CPU_SECONDS,
        memory_bytes: int | None = DEFAULT_PARSE_MEMORY_BYTES,
        isolate: bool | None = None,
        queue: ParseQueue | None = None,
    ) -> None:
        self.files = files
        self.parser = parser
        self.limits = limits or ParseLimits()
        self.poll_seconds = poll_seconds
        self.workers = workers
        self.cpu_seconds = cpu_seconds
        self.memory_bytes = memory_bytes
        self.queue = queue
        """With a queue, :meth:`request` defers a job instead of parsing in this process."""
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="companion-parse")
        self.isolate = parser is default_parser if isolate is None else isolate
        self._pool: Any = None
        """The pebble process pool, started by the first isolated parse (:meth:`_process_pool`)."""
        self._pool_lock = threading.Lock()
        self._closed = False
        self._resumes = UntilStorageAnswers("companion-parse-resume", pauses=RESUME_SECONDS)
        """Parses a storage outage aborted, submitted again once the database answers."""
        self._queues: dict[str, deque[tuple[str, Future]]] = {}
        """Waiting parses per owner (user id), oldest first."""
        self._turns: deque[str] = deque()
        """Owners with waiting parses, in round-robin order."""
        self._running: dict[str, int] = {}
        """Parses running per owner."""
        self._lock = threading.Lock()
        self._futures: dict[str, Future] = {}
        self._watches: dict[str, _Watch] = {}

    # -- parsing --------------------------------------------------------------------
    def submit(self, file_id: str) -> Future | None:
        """Start parsing ``file_id`` if it is ``pending`` (or its claim went stale).

        Returns:
            The future of this process's parse of the file (an existing one if it is
            already running here), or ``None`` when there is nothing to start: the parse
            has ended, or another process holds the claim.
        """
        file_id = str(file_id)
        with self._lock:
            running = self._futures.get(file_id)
            if running is not None:
                return running
            if not self.files.claim_parse(file_id):
                return None
            log.info("file.parse.claimed", file_id=file_id)  # one per file, however many waited
            owner = self.files.owner(file_id) or ""
            future: Future = Future()
            self._futures[file_id] = future
            if owner not in self._queues:
                self._queues[owner] = deque()
                self._turns.append(owner)
            self._queues[owner].append((file_id, future))
            self._dispatch()
        future.add_done_callback(lambda f: self._finished(file_id, f))
        return future

    def request(self, file_id: str) -> None:
        """Ask for ``file_id``'s parse: as a queue job when the service has a ``queue`` (any worker
        runs it, here or in another process), else started in this process (:meth:`submit`).

        Raises:
            StorageError: the job could not be stored, or the claim could not be written.
        """
        if self.queue is None:
            self.submit(file_id)
        elif self.files.state(str(file_id)) == ParseState.pending.value:
            self.queue.defer(str(file_id))

    def request_pending(self) -> int:
        """:meth:`request` every ``pending`` file (e.g. after a restart). Returns how many there were."""
        ids = self.files.pending_ids()
        for file_id in ids:
            self.request(file_id)
        return len(ids)

    def _owner_cap(self) -> int:
        return max(1, self.workers - 1)

    def _dispatch(self) -> None:
        """Start waiting parses while workers are free: owners in turn, none past its cap. Under ``_lock``."""
        busy = sum(self._running.values())
        skipped = 0
        while busy < self.workers and self._turns and skipped < len(self._turns):
            owner = self._turns[0]
            self._turns.rotate(-1)
            if self._running.get(owner, 0) >= self._owner_cap():  # a worker stays free for the next user
                skipped += 1
                continue
            skipped = 0
            file_id, future = self._queues[owner].popleft()
            if not self._queues[owner]:
                del self._queues[owner]
                self._turns.remove(owner)
            self._running[owner] = self._running.get(owner, 0) + 1
            busy += 1
            self._executor.submit(self._job, file_id, owner, future)

    def _job(self, file_id: str, owner: str, future: Future) -> None:
        try:
            result = self._run(file_id)
        except BaseException as exc:  # the database failed under the parse: the future says so
            with self._lock:
                self._done(owner)
            future.set_exception(exc)
            return
        with self._lock:
            self._done(owner)
        future.set_result(result)

    def _done(self, owner: str) -> None:
        """A parse of ``owner`` ended: free its slot and start the next. Under ``_lock``."""
        self._running[owner] -= 1
        if not self._running[owner]:
            del self._running[owner]
        self._dispatch()

    def submit_pending(self) -> int:
        """Submit every ``pending`` file (e.g. after a restart). Returns how many started."""
        return sum(1 for file_id in self.files.pending_ids() if self.submit(file_id) is not None)

    def _finished(self, file_id: str, future: Future) -> None:
        if not future.cancelled() and future.exception() is not None:
            exc = future.exception()
            log.error("file.parse.aborted", file_id=file_id, error_type=type(exc).__name__)
            if isinstance(exc, StorageError):  # the database failed under the parse: parse again once it is back
                self._resumes.defer(file_id, lambda: self._resume(file_id))
        with self._lock:
            self._futures.pop(file_id, None)
            watch = self._watches.get(file_id)
        if not future.cancelled() and future.exception() is None and future.result() == "superseded":
            self.submit(file_id)  # the file was edited while this parse ran: parse the new bytes
        if watch is not None:
            watch.wake.set()

    def _resume(self, file_id: str) -> None:
        """Give a parse's claim back and submit the file again (run by :attr:`_resumes` until the
        database answers, with pauses :data:`RESUME_SECONDS`); the parse then runs from the start.

        Raises:
            StorageError: the database still does not answer (the call is tried again later).
        """
        self.files.set_parse_result(file_id, state="pending")
        try:
            self.submit(file_id)
        except RuntimeError:  # the executor was shut down meanwhile: a later process parses it
            return
        log.info("file.parse.resumed_after_outage", file_id=file_id)

    def _run(self, file_id: str) -> str:
        try:
            stored = self.files.lookup(file_id)
            data = self.files.read_bytes(stored)
        except FileError as exc:
            self.files.set_parse_result(file_id, state="failed", parse_error=str(exc))
            return "failed"
        log.info("file.parse.start", file_id=file_id, mime=stored.mime, size_bytes=stored.size_bytes)
        try:
            extract = self._parse(data, stored)
        except FileParseError as exc:
            log.info("file.parse.failed", file_id=file_id, reason=exc.reason)
            self.files.set_parse_result(file_id, state="failed", parse_error=str(exc), sha256=stored.sha256)
            return "failed"
        except Exception as exc:  # a library bug on odd input must end the parse visibly, not hang it
            log.exception("file.parse.crashed", file_id=file_id, error_type=type(exc).__name__)
            self.files.set_parse_result(
                file_id,
                state="failed",
                parse_error=f"{stored.name}: the parser failed unexpectedly ({type(exc).__name__}: {exc}).",
                sha256=stored.sha256,
            )
            return "failed"
        if extract.needs_ocr:
            state = "needs_ocr"
        elif not extract.has_text:
            state = "empty"
        else:
            state = "ready"
        written = self.files.set_parse_result(
            file_id,
            state=state,
            extract=serialize(extract) if extract.pages else None,
            page_count=len(extract.pages),
            body_start_page=extract.body_start_page,
            sha256=stored.sha256,
        )
        if not written:  # edited while parsing: the edit's own parse will run
            log.info("file.parse.superseded", file_id=file_id)
            return "superseded"
        log.info(
            "file.parse.done",
            file_id=file_id,
            state=state,
            pages=len(extract.pages),
            body_start_page=extract.body_start_page,
        )
        return state

    def _process_pool(self) -> Any:
        """The parse subprocess pool, started on first use (a process that never parses, such as
        a CLI command, never starts it).

        Raises:
            RuntimeError: the service is closed.
        """
        with self._pool_lock:
            if self._closed:
                raise RuntimeError("the parse service is closed")
            if self._pool is None:
                import pebble

                from runtime.parsing._worker import limit_child

                # forkserver: a small clean process (the parsers preloaded) forks each worker, so a worker is
                # never a copy of the service's address space (models, pools) and starts in a fraction of a second
                context = multiprocessing.get_context("forkserver")
                context.set_forkserver_preload(["runtime.parsing._worker"])
                self._pool = pebble.ProcessPool(
                    max_workers=self.workers,
                    max_tasks=1,  # a fresh process per parse: its memory goes back when it ends
                    initializer=limit_child,
                    initargs=(self.cpu_seconds, self.memory_bytes),
                    context=context,
                )
                log.info("file.parse.pool_started", workers=self.workers)
            return self._pool

    def _parse(self, data: bytes, stored) -> Extract:
        """One parse: in a capped subprocess when isolated, else in this thread.

        Raises:
            FileParseError: the file's own (corrupt, encrypted, ``too_large``), or ``too_large``
                / ``too_slow`` when the subprocess ran out of memory, CPU or wall time.
        """
        if not self.isolate:
            return self.parser(data, name=stored.name, mime=stored.mime, limits=self.limits)
        from pebble import ProcessExpired

        from runtime.parsing._worker import parse_in_child

        wall = None if self.cpu_seconds is None else 2 * self.cpu_seconds + 10
        task = self._process_pool().schedule(
            parse_in_child, args=(data, stored.name, stored.mime, self.limits), timeout=wall
        )
        try:
            status, value, reason = task.result()
        except FutureTimeout as exc:
            raise FileParseError(
                f"{stored.name}: parsing it took longer than {wall:g} s; not parsed.", reason="too_slow"
            ) from exc
        except ProcessExpired as exc:  # killed: SIGXCPU/SIGKILL at the CPU cap, or a crash in a library
            log.warning("file.parse.killed", file_id=stored.id, exitcode=exc.exitcode)
            raise FileParseError(
                f"{stored.name}: the parser stopped on this file (it used more than {self.cpu_seconds:g} s of CPU "
                "or crashed); not parsed.",
                reason="too_slow",
            ) from exc
        if status == "failed":
            raise FileParseError(value, reason=reason or "corrupt")
        return value

    # -- waiting --------------------------------------------------------------------
    def watch(self, file_id: str) -> WaitHandle:
        """A handle to wait on ``file_id``'s parse; asks for the parse if it is pending (:meth:`request`).

        All handles on one file share one watch. Cancel the handle when done.
        """
        file_id = str(file_id)
        self.request(file_id)
        with self._lock:
            watch = self._watches.get(file_id)
            if watch is None:
                watch = _Watch(file_id, state=self.files.state(file_id))
                self._watches[file_id] = watch
                log.debug("file.watch.started", file_id=file_id)  # one per file while anyone waits on it
                watch.thread = threading.Thread(
                    target=self._poll, args=(watch,), name=f"companion-watch-{file_id}", daemon=True
                )
                watch.thread.start()
            watch.waiters += 1
        return WaitHandle(self, watch)

    def wait(self, file_id: str, timeout: float) -> str | None:
        """Wait up to ``timeout`` seconds for ``file_id``'s parse (starting it if pending).

        Returns the state, as :meth:`WaitHandle.wait`.
        """
        with self.watch(file_id) as handle:
            return handle.wait(timeout)

    def active_watches(self) -> int:
        """Files someone is waiting on right now."""
        with self._lock:
            return len(self._watches)

    def _release(self, watch: _Watch) -> None:
        with self._lock:
            watch.waiters -= 1
            if watch.waiters > 0:
                return
            watch.stopped = True
            if self._watches.get(watch.file_id) is watch:
                del self._watches[watch.file_id]
        watch.wake.set()

    def _poll(self, watch: _Watch) -> None:
        while not watch.stopped:
            try:
                state = self.files.state(watch.file_id)
            except Exception as exc:  # the database blipped: keep waiting, the caller's timeout bounds it
                log.warning("file.watch.poll_failed", file_id=watch.file_id, error_type=type(exc).__name__)
                state = watch.state
            watch.state = state
            if state is None or state in FINAL_PARSE_STATES:
                watch.done.set()
                break
            watch.wake.wait(self.poll_seconds)
            watch.wake.clear()
        with self._lock:
            if self._watches.get(watch.file_id) is watch:
                del self._watches[watch.file_id]  # ended: a later watch() starts afresh

    def close(self) -> None:
        """Stop accepting parses and wait for running ones to end; close the queue's connections."""
        self._resumes.close()
        self._executor.shutdown(wait=True, cancel_futures=False)
        if self.queue is not None:
            self.queue.close()
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
            pool.join()

    def __enter__(self) -> ParseService:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
