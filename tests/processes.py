"""Runtime processes started as a user starts them (``python -m runtime.cli ...``) for the
multi-process tests: ``companion serve`` on a free port, ``companion jobs run``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
START_SECONDS = 240.0
"""Longest a service may take to answer /healthz (opening an engine takes 10-15 s alone, longer
when several processes start at once on a busy machine)."""


def runtime_env(db_url: str, api_base: str, **extra: str) -> dict[str, str]:
    """The environment of a runtime process on ``db_url`` with the loopback model at ``api_base``."""
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DATABASE_URL": db_url,
        "COMPANION_MODEL": "openai/fake-model",
        "COMPANION_API_BASE": api_base,
        "OPENAI_API_KEY": "sk-test",
        "COMPANION_CONTEXT_WINDOW": "4096",
        "COMPANION_LOG_LEVEL": "warning",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        **extra,
    }


class Process:
    """A ``companion`` subprocess; its output is collected in :attr:`output` as it comes."""

    def __init__(self, args: list[str], env: Mapping[str, str]) -> None:
        self.args = args
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "runtime.cli", *args],
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its workers form one process group, stopped together
        )
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.output.append(line)

    def text(self) -> str:
        return "".join(self.output)

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL what is left after 20 s."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        self._reader.join(5)


class Server(Process):
    """``companion serve --port 0 [...]``; :meth:`wait_ready` gives its base URL."""

    def __init__(self, env: Mapping[str, str], *extra: str) -> None:
        super().__init__(["serve", "--host", "127.0.0.1", "--port", "0", *extra], env)
        self.base = ""

    def wait_ready(self, deadline: float) -> str:
        """Block until /healthz answers (``deadline`` is a ``time.monotonic()`` value); returns the base URL.

        Raises:
            AssertionError: the process exited or the deadline passed (with its output)."""
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.args} exited with {self.popen.returncode}:\n{self.text()[-4000:]}")
            if not self.base:  # the announced URL; with --port 0 in one process, the one uvicorn reports
                found = re.search(r"companion serve: (http://[\d.]+:\d+)", self.text())
                if found is None or found.group(1).endswith(":0"):
                    found = re.search(r"Uvicorn running on (http://[\d.]+:\d+)", self.text())
                if found is not None:
                    self.base = found.group(1)
            if self.base:
                try:
                    if httpx.get(self.base + "/healthz", timeout=2).status_code == 200:
                        return self.base
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        raise AssertionError(f"{self.args} not ready in time:\n{self.text()[-4000:]}")


def children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
