"""Log lines: one event a line, whole, even when several processes share one stream."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_LOGGING_PROCESS = """
import structlog
from runtime.logs import configure_logging
configure_logging("info")
log = structlog.get_logger("companion.test")
for i in range(2000):
    log.info("service.worker_ready", pid=12345, i=i)
"""


def test_processes_sharing_stderr_never_glue_their_lines_together():
    # as the workers of `companion serve --workers N` share the server's stderr
    read, write = os.pipe()
    processes = [subprocess.Popen([sys.executable, "-c", _LOGGING_PROCESS], stderr=write, cwd=REPO) for _ in range(3)]
    os.close(write)
    with open(read, "rb") as stream:
        lines = stream.read().decode().splitlines()
    assert all(p.wait(timeout=120) == 0 for p in processes)
    line = re.compile(r"\S+Z \[info\s*\] service\.worker_ready\s+i=\d+ pid=12345")
    assert len(lines) == 6000
    assert [text for text in lines if not line.fullmatch(text)] == []
