"""Shared test support for the file tests: a counting, gated parser and the file fixtures."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import structlog
from structlog.testing import capture_logs

from memory.files import FileStore
from runtime.files import ParseService
from runtime.parsing import parse_document

LONG = 30.0
"""An upper bound no passing test comes near: waits end on events, not on time."""


class GatedParser:
    """The real parser behind a gate, counting its invocations."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = threading.Event()
        self.gate = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, data, *, name, mime, limits):
        with self._lock:
            self.calls += 1
        self.started.set()
        assert self.gate.wait(LONG), "the test never opened the gate"
        return parse_document(data, name=name, mime=mime, limits=limits)


@pytest.fixture
def files(store, tmp_path) -> FileStore:
    return FileStore(store.engine)


@pytest.fixture
def parser():
    p = GatedParser()
    yield p
    p.gate.set()


@pytest.fixture
def parses(files, parser):
    """A parse service whose parser waits for ``parser.gate``."""
    svc = ParseService(files, parser=parser, poll_seconds=0.05)
    yield svc
    parser.gate.set()
    svc.close()


@pytest.fixture
def parse_log() -> Iterator[Callable[[str], int]]:
    """How many events of a name the parse service logged during the test: its production log
    (``file.parse.claimed``, ``file.parse.pool_started``, ``file.watch.started``), not a counter
    kept for tests."""
    structlog.reset_defaults()
    with capture_logs() as captured:
        yield lambda name: sum(1 for e in captured if e["event"] == name)
    structlog.reset_defaults()
