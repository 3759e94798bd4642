"""Running a turn in a worker thread and handing its reply pieces to an async response.

:meth:`runtime.turn.Engine.turn` is synchronous and streams through an ``on_delta``
callback. :func:`turn_events` runs it on a worker of anyio's thread pool, under the same
capacity limiter as every other blocking call of the service (starlette's
``run_in_threadpool``; anyio's default is 40 threads), and hands the callback's pieces over
a memory object stream as an async iterator of ``("delta", text)`` items, then one
``("done", TurnResult)`` or ``("error", exception)``. A turn that finds every thread busy
waits for one; no route starts a thread of its own.

If the client goes away, the iterator is simply dropped: the thread keeps going, the
reply is stored complete (or, if the model's stream broke, as far as it came, marked
``interrupted``), and later pieces are discarded. So a disconnect never loses the
stored user turn and never leaves a half-written turn behind.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.to_thread

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


_running: set[asyncio.Task] = set()
"""Turns whose reader may have gone: kept referenced until their thread ends."""


async def turn_events(run: Run, *, limiter: anyio.CapacityLimiter | None = None) -> AsyncIterator[tuple[str, Any]]:
    """Run ``run(on_delta)`` on anyio's thread pool; yield its deltas, then its result or its error.

    Args:
        limiter: the capacity limiter the turn's thread counts against; ``None``: anyio's
            default thread limiter, the one ``run_in_threadpool`` uses.
    """
    loop = asyncio.get_running_loop()
    send, receive = anyio.create_memory_object_stream[tuple[str, Any]](math.inf)

    def deliver(item: tuple[str, Any]) -> None:
        try:
            send.send_nowait(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the reader went away (client hang-up): the turn completes and is stored regardless

    def put(item: tuple[str, Any]) -> None:
        try:
            loop.call_soon_threadsafe(deliver, item)
        except RuntimeError:  # the event loop is gone (server shutting down): the turn still completes
            pass

    def work() -> None:
        try:
            result = run(lambda piece: put(("delta", piece)))
        except BaseException as exc:  # handed to the response, which maps it to an error event
            put(("error", exc))
        else:
            put(("done", result))

    async def in_pool() -> None:
        with send:
            await anyio.to_thread.run_sync(work, limiter=limiter)

    task = loop.create_task(in_pool())  # not a child of the response: a hang-up does not cancel the turn
    _running.add(task)
    task.add_done_callback(_running.discard)
    with receive:
        async for kind, value in receive:
            yield kind, value
            if kind != "delta":
                return
