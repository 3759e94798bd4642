"""The load-and-soak benchmark runs at a small size on every CI run: nothing acknowledged is
lost or duplicated, every reply answers its own message, and the sessions compact."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_small_soak_loses_nothing_and_compacts(tmp_path):
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "bench_soak.py"),
            "--sessions", "2", "--turns", "8", "--steady-seconds", "4", "--rate", "2", "--window", "1024",
            "--json", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())["all"]
    assert report["acknowledged"] == report["sent"] == report["stored"] >= 16
    assert (report["lost"], report["duplicated"], report["crossed"]) == (0, 0, 0)
    assert report["compactions"] >= 1 and report["open_breakers"] == 0
    assert 0 < report["largest_context"] <= report["window_tokens"] == 1024
