"""Running a turn in a worker thread and handing its reply pieces to an async response.

:meth:`runtime.turn.Engine.turn` is synchronous and streams through an ``on_delta``
callback. :func:`turn_events` runs it on its own (non-daemon) thread and turns the
callback into an async iterator of ``("delta", text)`` items, then one
``("done", TurnResult)`` or ``("error", exception)``.

If the client goes away, the iterator is simply dropped: the thread keeps going, the
reply is stored complete (or, if the model's stream broke, as far as it came, marked
``interrupted``), and later pieces are discarded. So a disconnect never loses the
stored user turn and never leaves a half-written turn behind.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator, Callable

from runtime.turn import TurnClaim, TurnResult

Run = Callable[[Callable[[str], None]], TurnResult]


class ClaimedRun:
    """A turn the request claimed its session for before answering (so a busy session is a plain
    409 ``turn_in_progress``, never an event in a stream). The claim is released when the turn
    ends, or, if the turn never started (the client left before the stream began), when the
    response is done (:meth:`abandon`)."""

    def __init__(self, claim: TurnClaim, work: Callable[[TurnClaim, Callable[[str], None] | None], TurnResult]) -> None:
        self.claim = claim
        self.work = work
        self.started = False

    def __call__(self, on_delta: Callable[[str], None] | None = None) -> TurnResult:
        self.started = True
        try:
            return self.work(self.claim, on_delta)
        finally:
            self.claim.release()

    def abandon(self) -> None:
        if not self.started:
            self.claim.release()


async def turn_events(run: Run) -> AsyncIterator[tuple[str, Any]]:
    """Run ``run(on_delta)`` on a thread; yield its deltas, then its result or its error."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def put(item: tuple[str, Any]) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone (server shutting down): the turn still completes
            pass

    def work() -> None:
        try:
            result = run(lambda piece: put(("delta", piece)))
        except BaseException as exc:  # handed to the response, which maps it to an error event
            put(("error", exc))
        else:
            put(("done", result))

    threading.Thread(target=work, name="companion-turn", daemon=False).start()
    while True:
        kind, value = await queue.get()
        yield kind, value
        if kind != "delta":
            return
