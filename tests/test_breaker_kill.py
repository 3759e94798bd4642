"""SIGKILL during a compaction loses no turn and leaves no half-written summary.

A child process (``tests/_compaction_child.py``) compacts a session on the test
database and is killed with SIGKILL at two points: while its summary model hangs
(the loopback server never answers) and inside the compaction's transaction, after
the archive rows, the new summary and the turn states were sent but before COMMIT.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest
from sqlalchemy import text

from memory.tables import TurnState
from runtime.compaction import ExtractiveSummarizer
from tests.conftest import REPO
from tests.test_compaction import add_exchanges, compact, compactor, snapshot


def _line_reader(proc: subprocess.Popen) -> queue.Queue[str | None]:
    """The child's stdout lines, read by a thread (``None`` once it closes)."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line.strip())
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_for_line(lines: queue.Queue[str | None], proc: subprocess.Popen, expected: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        if line is None:
            raise AssertionError(f"the child exited (status {proc.wait()}) before printing {expected!r}")
        if line == expected:
            return
    raise AssertionError(f"the child did not print {expected!r} within {timeout} s")


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("model-hangs", id="while-the-model-hangs"),
        pytest.param("inside-commit", id="inside-the-transaction"),
    ],
)
def test_sigkill_during_compaction_loses_no_turn_and_leaves_no_half_written_summary(
    store, embedder, db_url, fake_llm, tmp_path, mode
):
    add_exchanges(store, 8)
    assert compact(compactor(store, embedder, ExtractiveSummarizer())).summarized  # an existing summary to protect
    add_exchanges(store, 6, start=8)
    before, state_before = snapshot(store), store.compaction.state("s1")
    turns_before = [(t.seq, t.content) for t in store.turns.of_session("s1")]
    arrived, release = threading.Event(), threading.Event()
    fake_llm.responder = lambda body: (arrived.set(), release.wait(60), "{}")[2]

    proc = subprocess.Popen(
        [sys.executable, "-m", "tests._compaction_child", db_url, "s1", "u1", mode, fake_llm.api_base],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "child.err").open("w"),
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    lines = _line_reader(proc)
    try:
        _wait_for_line(lines, proc, "ready")
        if mode == "model-hangs":
            assert arrived.wait(60), "the child's summary request never reached the fake model"
        else:
            _wait_for_line(lines, proc, "in-commit")
            with store.engine.connect() as conn:  # the child's writes are in flight, not visible
                assert conn.execute(text("SELECT count(*) FROM turns WHERE state = 'summarized'")).scalar() == sum(
                    1 for _, s in before[0] if s == TurnState.summarized
                )
        # the child holds the session's compaction lock: this process skips rather than compacting twice
        assert compact(compactor(store, embedder, ExtractiveSummarizer())) is None
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        release.set()
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)

    assert [(t.seq, t.content) for t in store.turns.of_session("s1")] == turns_before  # no turn lost
    assert snapshot(store) == before  # no archive row, summary or turn state half-written
    state = store.compaction.state("s1")
    assert (state.consecutive_failures, state.compactions, state.breaker_opened_at) == (
        state_before.consecutive_failures,
        state_before.compactions,
        state_before.breaker_opened_at,
    )
    # the dead child's lock went with its connection: the next compaction runs
    deadline = time.monotonic() + 20
    outcome = None
    while outcome is None and time.monotonic() < deadline:
        outcome = compact(compactor(store, embedder, ExtractiveSummarizer()))
        time.sleep(0.2)
    assert outcome is not None and outcome.summarized
