"""Threads: streamed turns run on the service's bounded thread pool; the engine's shared image
cache stays whole under concurrent turns."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict

import anyio.to_thread
import pytest

from memory.files import FileStore
from runtime.accounting import counter_for
from runtime.config import Settings
from runtime.context import AttachedFile
from runtime.service.api.streaming import turn_events
from runtime.turn import _images
from runtime.turn._images import TurnImages
from tests.image_fixtures import small_png


def test_streamed_turns_wait_for_the_bounded_thread_pool():
    """Five streamed turns with a pool of two: at most two run at once, and all five finish."""
    active = 0
    peak = 0
    lock = threading.Lock()
    gate = threading.Event()

    def run(on_delta):
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        on_delta("piece")
        gate.wait(10)
        with lock:
            active -= 1
        return "result"

    async def consume() -> list:
        return [item async for item in turn_events(run)]

    async def main() -> list:
        anyio.to_thread.current_default_thread_limiter().total_tokens = 2  # this loop's default limiter
        tasks = [asyncio.create_task(consume()) for _ in range(5)]
        await asyncio.sleep(0.5)
        gate.set()
        return await asyncio.gather(*tasks)

    results = asyncio.run(main())
    assert peak == 2
    assert all(r == [("delta", "piece"), ("done", "result")] for r in results)


def test_a_reader_that_goes_away_leaves_the_turn_running_to_its_end():
    finished = threading.Event()
    release = threading.Event()

    def run(on_delta):
        on_delta("first")
        release.wait(10)
        on_delta("after the hang-up")
        finished.set()
        return "stored"

    async def main() -> None:
        events = turn_events(run)
        assert await events.__anext__() == ("delta", "first")
        await events.aclose()  # the client hung up
        release.set()
        for _ in range(100):
            if finished.is_set():
                break
            await asyncio.sleep(0.05)

    asyncio.run(main())
    assert finished.is_set()


@pytest.fixture
def images(store, tmp_path) -> TurnImages:
    files = FileStore(store.engine)
    return TurnImages(
        settings=Settings().vision, store=store, files=files, counter=counter_for("gpt-4o-mini"), model="gpt-4o-mini"
    )


class SlowCache(OrderedDict):
    """The cache's own OrderedDict with a pause after each look-up, so that another thread's
    eviction lands between a turn's look-up and its use of what it found."""

    def __contains__(self, key) -> bool:
        found = super().__contains__(key)
        time.sleep(0.005)
        return found

    def get(self, key, default=None):
        found = super().get(key, default)
        time.sleep(0.005)
        return found


def test_the_shared_image_cache_survives_concurrent_turns(images, monkeypatch):
    """Four threads encode three images through a cache of one: hits, moves and evictions
    interleave, and no call fails."""
    monkeypatch.setattr(_images, "ENCODED_CACHE", 1)
    images._encoded = SlowCache()
    attached = []
    for colour in ((200, 30, 30), (30, 200, 30), (30, 30, 200)):
        stored = images.files.add(user_id="u1", name="p.png", data=small_png(colour=colour))
        attached.append(
            AttachedFile(
                file_id=stored.id,
                name="p.png",
                mime="image/png",
                size_bytes=stored.size_bytes,
                durability="durable",
                parse_state="ready",
            )
        )
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def hammer(offset: int) -> None:
        try:
            start.wait(10)
            for i in range(40):
                assert images._encode(attached[(i + offset) % 3]) is not None
                assert images._encode(attached[(i + offset) % 3]) is not None  # a hit another thread may evict
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:1]
