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

from runtime.turn import TurnResult

Run = Callable[[Callable[[str], None]], TurnResult]


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
