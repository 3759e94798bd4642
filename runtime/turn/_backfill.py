"""When the embedder was down: the turn goes on, and the vectors it could not make come later.

A turn whose message could not be embedded is stored without a vector, and a compaction whose
turns could not be embedded stores its segments without keys (recall finds them by full text
and dates meanwhile). Each then asks its engine's :class:`BackfillScheduler` for a backfill
(:mod:`memory.backfill`), which runs once the embedder answers again:

- :class:`InlineBackfill` (the default): a thread of this process runs it, and again
  :data:`WAITS` seconds apart while the embedder is still down;
- the service's queued backfill (``runtime.service._backfill_jobs``): a job any queue worker runs,
  deferred again while the embedder is down, and a sweep every ten minutes.

Events (``companion.backfill``): ``embeddings.backfill_waiting`` (seconds, error),
``embeddings.backfill_failed`` (error class), and :mod:`memory.backfill`'s ``embeddings.backfilled``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

import structlog

from errors import EmbedderUnavailableError
from memory.backfill import Backfilled, Missing
from memory.embeddings import Embedder
from memory.store import Store
from runtime.accounting import TokenCounter
from runtime.context import without_names

log = structlog.get_logger("companion.backfill")

WAITS = (5.0, 15.0, 30.0, 60.0)
"""Seconds between the inline backfill's attempts while the embedder is down (then the last, again)."""


class Backfiller:
    """Runs the embeddings backfill for one engine's store, embedder and counter."""

    def __init__(self, *, store: Store, embedder: Embedder, counter: TokenCounter) -> None:
        self.store = store
        self.embedder = embedder
        self.counter = counter

    def run(self) -> Backfilled:
        """Embed what is missing now (:func:`memory.backfill.backfill`).

        Raises:
            EmbedderUnavailableError: the embedder is still down; what was written before stays.
            EmbeddingModelMismatch: the database records another model (a switch completed
                while this process ran the old one); nothing is written.
            StorageError: the database failed.
        """
        return self.store.backfill.run(self.embedder, count_tokens=self.counter.count_text, user_text=without_names)

    def missing(self) -> Missing:
        """What is still without a vector."""
        return self.store.backfill.missing()


class BackfillScheduler(Protocol):
    """Where a backfill runs once something was stored without its vector."""

    name: str

    def request(self) -> None:
        """Ask for a backfill (something was just stored without a vector); returns at once."""
        ...


class InlineBackfill:
    """Runs the backfill on one thread of this process: at once when asked, then again
    :data:`WAITS` apart while the embedder is down. Asked while it runs, it runs once more after."""

    name = "inline"

    def __init__(
        self,
        backfiller: Backfiller,
        *,
        waits: tuple[float, ...] = WAITS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.backfiller = backfiller
        self.waits = waits
        self.sleep = sleep
        self._lock = threading.Lock()
        self._asked = False
        self._thread: threading.Thread | None = None
        self.runs = 0
        """Backfills that completed."""

    def request(self) -> None:
        with self._lock:
            self._asked = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="companion-backfill", daemon=True)
                self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until no backfill runs or waits; whether that happened within ``timeout`` seconds."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self._thread is None or not self._thread.is_alive()

    def _loop(self) -> None:
        failures = 0
        while True:
            with self._lock:
                if not self._asked:
                    self._thread = None
                    return
                self._asked = False
            try:
                self.backfiller.run()
                self.runs += 1
                failures = 0
            except EmbedderUnavailableError as exc:
                wait = self.waits[min(failures, len(self.waits) - 1)]
                failures += 1
                log.info("embeddings.backfill_waiting", seconds=wait, error=type(exc).__name__, status=exc.status)
                with self._lock:
                    self._asked = True
                self.sleep(wait)
            except Exception as exc:  # a model switch, a database failure: the next request tries again
                log.warning("embeddings.backfill_failed", error=type(exc).__name__)
                with self._lock:
                    if not self._asked:
                        self._thread = None
                        return
