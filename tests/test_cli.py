"""The `companion` command as a user runs it: a subprocess on a real database."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from memory.database import head_revision
from runtime.cli import main
from tests.conftest import SAMPLE


def _run(args, env, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_db_upgrade_then_replay_reports_compaction_recall_and_no_overflow(empty_db_url, tmp_path):
    env = {**os.environ, "DATABASE_URL": empty_db_url}
    upgrade = _run(["db", "upgrade", "--embedding-dim", "384"], env)
    assert upgrade.returncode == 0, upgrade.stderr
    assert f"revision {head_revision()}" in upgrade.stdout

    report_path = tmp_path / "report.json"
    result = _run(["replay", str(SAMPLE), "--window", "1024", "--report", str(report_path)], env)
    assert result.returncode == 0, result.stderr
    assert "evidence recall" in result.stdout and "overflows" in result.stdout
    report = json.loads(report_path.read_text())
    conv = report["conversations"][0]
    assert report["window"] == 1024
    assert conv["turns"] == 41 and conv["sessions"] == 4
    assert conv["overflows"] == 0
    assert conv["compactions"] >= 1 and conv["archived_segments"] >= 1
    assert conv["largest_context"] <= 1024
    assert conv["evidence_total"]["all"] > 0

    # the replayed session as it ran: its context against the replay's window
    inspected = _run(["inspect", conv["session_id"], "--window", "1024"], env)
    assert inspected.returncode == 0, inspected.stderr
    assert "reserved of 1024 tokens" in inspected.stdout


def test_replay_of_unknown_conversation_is_a_clear_error(empty_db_url):
    env = {**os.environ, "DATABASE_URL": empty_db_url}
    result = _run(["replay", str(SAMPLE), "--conversation", "conv-99"], env)
    assert result.returncode == 2
    assert "conv-99" in result.stderr and "sample-ana" in result.stderr


def test_replay_on_unmigrated_database_says_to_run_db_upgrade(empty_db_url):
    env = {**os.environ, "DATABASE_URL": empty_db_url}
    result = _run(["replay", str(SAMPLE)], env)
    assert result.returncode == 2
    assert "companion db upgrade" in result.stderr


def test_unreachable_database_is_a_one_line_error_naming_database_url():
    env = {**os.environ, "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x", "PGCONNECT_TIMEOUT": "2"}
    result = _run(["db", "upgrade", "--embedding-dim", "384"], env)
    assert result.returncode == 69  # a dependency outage: sysexits.h's EX_UNAVAILABLE, not a usage error
    assert "DATABASE_URL" in result.stderr and "Traceback" not in result.stderr
    inspect = _run(["breaker", "show", "s1"], env)
    assert inspect.returncode == 69 and len(inspect.stderr.strip().splitlines()) == 1
    assert "Connection refused" in inspect.stderr and "DATABASE_URL" in inspect.stderr  # what failed, not the hint


def test_report_into_a_missing_directory_is_refused_before_the_run(empty_db_url, tmp_path):
    env = {**os.environ, "DATABASE_URL": empty_db_url}
    result = _run(["replay", str(SAMPLE), "--report", str(tmp_path / "missing" / "out.json")], env)
    assert result.returncode == 2
    assert "--report" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "argv, says",
    [
        pytest.param(["profile", "set", "", "--name", "X"], "must be a non-empty string", id="empty-user"),
        pytest.param(["profile", "set", "a\tb", "--name", "X"], "control characters", id="control-char-user"),
        pytest.param(["files", "add", " ", "notes.txt"], "must be a non-empty string", id="blank-file-owner"),
        pytest.param(["kb", "add", "", "notes.md"], "must be a non-empty string", id="empty-persona"),
        pytest.param(["chat", "--user", "ana", "--session", "x" * 201], "at most 200", id="long-session"),
        pytest.param(["serve", "--port", "99999"], "outside 0-65535", id="port-out-of-range"),
        pytest.param(
            ["jobs", "close-idle", "--once", "--idle-hours", "-1"], "0 or more hours", id="negative-idle-hours"
        ),
    ],
)
def test_bad_ids_and_numbers_are_refused_before_anything_runs(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_a_model_that_cannot_be_loaded_is_a_one_line_error(db_url):
    # Hugging Face's own message for a name it cannot find offline spans several lines
    env = {**os.environ, "DATABASE_URL": db_url, "COMPANION_EMBEDDING_MODEL": "nobody/no-such-model"}
    result = _run(["replay", str(SAMPLE), "--window", "1024"], {**env, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "Cannot load the embedding model 'nobody/no-such-model'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
