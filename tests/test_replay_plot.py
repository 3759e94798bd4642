"""``companion replay --plot``: the per-turn timeline the replay records, and the plot drawn
from it, for both input formats (LoCoMo JSON and JSONL), as PNG and as a self-contained
HTML page."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys

import pytest
from PIL import Image

from runtime.accounting import SOURCES
from runtime.service import load_conversations, replay_conversation
from runtime.service.replay_plot import write_plot
from tests.conftest import SAMPLE

WINDOW = 1024


def _run(args, env, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(io.BytesIO(data)) as image:
        image.load()  # a truncated file fails here
        return image.size


def test_a_locomo_replay_records_each_turns_context_and_plots_it_as_png(make_engine_for, tmp_path):
    engine = make_engine_for(window=WINDOW)
    (conv,) = load_conversations(SAMPLE)
    report = replay_conversation(engine, conv)

    timeline = report.timeline
    assert timeline[-1].turn == report.turns == len(conv.turns)
    assert [p.turn for p in timeline] == sorted({p.turn for p in timeline})
    replied = [p for p in timeline if p.sources is not None]
    assert replied and all(set(p.sources) == set(SOURCES) for p in replied)
    assert all(p.total_tokens + p.reply_reserve <= WINDOW for p in replied)
    assert all(sum(p.sources.values()) <= p.total_tokens for p in replied)
    assert timeline[-1].compactions == report.compactions >= 1
    assert timeline[-1].archived_segments == report.archived_segments >= 1
    assert timeline[-1].summary_tokens == report.summary_tokens > 0
    assert [p.archived_segments for p in timeline] == sorted(p.archived_segments for p in timeline)
    assert timeline[0].archived_segments == 0 and timeline[0].summary_tokens == 0
    assert json.loads(json.dumps(report.as_dict(), default=str))["timeline"][-1]["turn"] == report.turns

    (written,) = write_plot([report], tmp_path / "replay.png")
    assert written == tmp_path / "replay.png"
    assert _png_size(written.read_bytes()) == (1200, 1100)


def test_a_jsonl_replay_plots_to_a_self_contained_html_page(db_url, tmp_path):
    (conv,) = load_conversations(SAMPLE)
    jsonl = tmp_path / "chat.jsonl"
    jsonl.write_text(
        "\n".join(json.dumps({"role": t.role, "content": t.text, "timestamp": t.at.isoformat()}) for t in conv.turns),
        encoding="utf-8",
    )
    out = tmp_path / "plot.html"
    result = _run(
        ["replay", str(jsonl), "--window", str(WINDOW), "--plot", str(out)], {**os.environ, "DATABASE_URL": db_url}
    )
    assert result.returncode == 0, result.stderr
    assert f"plot written to {out}" in " ".join(result.stdout.split())
    page = out.read_text(encoding="utf-8")
    assert "<h2>chat</h2>" in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing is fetched when it is opened
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 1
    assert _png_size(base64.b64decode(images[0])) == (1200, 1100)


@pytest.mark.parametrize(
    "target, says",
    [
        pytest.param("plot.svg", "give a file ending in .png or .html", id="unknown-suffix"),
        pytest.param("missing-dir/plot.png", "its directory does not exist", id="missing-directory"),
    ],
)
def test_a_bad_plot_path_fails_before_the_replay_runs(tmp_path, target, says):
    env = {**os.environ, "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x", "PGCONNECT_TIMEOUT": "2"}
    result = _run(["replay", str(SAMPLE), "--plot", str(tmp_path / target)], env, timeout=60)
    assert result.returncode == 2
    assert says in result.stderr and "--plot" in result.stderr
    assert not (tmp_path / target).exists()
