"""The README's "From Python" example runs exactly as written.

The code block is taken from README.md as it stands and run as a script in a fresh
Python process, with only the environment it says it reads: the test database
(``DATABASE_URL``) and the loopback fake model (``COMPANION_MODEL``,
``COMPANION_API_BASE``, ``COMPANION_CONTEXT_WINDOW``, ``OPENAI_API_KEY``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from memory.database import make_engine
from memory.store import Store
from tests.conftest import REPO

SECTION = "### From Python"
"""The README heading the example sits under; its first ``python`` code block is the example."""

SOURCES = ("persona", "memory", "retrieval", "summary", "recent")


def readme_example() -> str:
    """The first fenced ``python`` block after :data:`SECTION` in README.md, verbatim."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.find("\n" + SECTION + "\n")
    assert start >= 0, f"README.md has no {SECTION!r} section"
    match = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE).search(text, start)
    assert match is not None, f"no python code block under {SECTION!r} in README.md"
    return match.group(1)


def test_readme_python_example_runs_two_turns_and_prints_the_context_by_source(db_url, fake_llm, tmp_path):
    script = tmp_path / "readme_example.py"
    script.write_text(readme_example(), encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DATABASE_URL": db_url,
        "COMPANION_MODEL": "openai/fake-model",
        "COMPANION_API_BASE": fake_llm.api_base,
        "COMPANION_CONTEXT_WINDOW": "2048",
        "OPENAI_API_KEY": "sk-test",
        "COMPANION_DATA_DIR": str(tmp_path / "data"),
    }

    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )

    assert run.returncode == 0, run.stderr
    # two turns, each answered by the model: two requests, the second carrying the first exchange
    chats = [r for r in fake_llm.requests if "messages" in r]
    assert len(chats) == 2
    assert any("Lisbon" in str(m.get("content")) for m in chats[1]["messages"] if m["role"] == "user")
    assert run.stdout.count(fake_llm.default_reply) == 2
    # the context read by source: one line per source, each naming its tokens and cap
    lines = run.stdout.splitlines()
    for source in SOURCES:
        assert any(line.split()[:1] == [source] and "tokens" in line for line in lines), (source, run.stdout)
    # and the turns are stored: two exchanges in the session the example names
    store = Store(make_engine(db_url))
    try:
        turns = store.turns.of_session("ana-1")
        assert [t.role for t in turns] == ["user", "assistant", "user", "assistant"]
    finally:
        store.engine.dispose()
