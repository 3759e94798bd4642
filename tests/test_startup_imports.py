"""Commands that need no embedding and no model do not import torch, sentence-transformers,
ONNX Runtime or litellm, nor the job queue's procrastinate unless they queue; the embedder loads
its model when it first embeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_CLI_PROBE = """
import json, sys
from runtime.cli import main
code = main(sys.argv[1:])
heavy = ("torch", "sentence_transformers", "transformers", "onnxruntime", "litellm", "procrastinate")
print(json.dumps({"code": code, "heavy": [m for m in heavy if m in sys.modules]}))
"""


def _run(code: str, *args: str, db_url: str, tmp_path: Path) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": db_url,
        "COMPANION_DATA_DIR": str(tmp_path / "data"),
        "COMPANION_CONTEXT_WINDOW": "4096",
        "COMPANION_LOG_LEVEL": "error",
    }
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "argv, heavy_allowed",
    [
        pytest.param(["breaker", "show", "s1"], (), id="breaker-show"),
        pytest.param(["profile", "show", "u1"], (), id="profile-show"),
        # opens a whole engine (its token counter asks litellm for the model's tokenizer), embeds nothing
        pytest.param(["session", "delete", "s1", "--user", "u1"], ("litellm",), id="session-delete"),
    ],
)
def test_a_command_that_embeds_nothing_imports_no_embedder(store, db_url, tmp_path, argv, heavy_allowed):
    store.sessions.ensure(session_id="s1", user_id="u1")
    store.turns.add(session_id="s1", role="user", content="I adopted a puppy called Biscuit.", tokens=10)
    result = _run(_CLI_PROBE, *argv, db_url=db_url, tmp_path=tmp_path)
    assert result["code"] == 0
    assert [m for m in result["heavy"] if m not in heavy_allowed] == []


_ENGINE_PROBE = """
import json, sys
from runtime.config import Settings
from runtime.service import open_engine
engine = open_engine(Settings.from_env(), with_model=False)
opened = [m for m in ("onnxruntime", "torch", "sentence_transformers") if m in sys.modules]
vector = engine.embedder.embed(["I adopted a puppy called Biscuit."])[0]
after = [m for m in ("onnxruntime", "torch", "sentence_transformers") if m in sys.modules]
print(json.dumps({"opened": opened, "dimension": engine.embedder.dimension, "length": len(vector), "after": after}))
"""


def test_the_engine_opens_without_the_embedding_model_and_loads_it_on_first_use(db_url, tmp_path, embedder):
    embedder.embed(["the model's graph is in the default cache from here on"])
    result = _run(_ENGINE_PROBE, db_url=db_url, tmp_path=tmp_path)
    # the default backend runs the bundled model without importing torch at all
    assert result == {"opened": [], "dimension": 384, "length": 384, "after": ["onnxruntime"]}


_TORCH_PROBE = """
import json, sys
from runtime.config import Settings
from runtime.service import open_engine
engine = open_engine(Settings.from_env(), with_model=False)
engine.embedder.embed(["I adopted a puppy called Biscuit."])
print(json.dumps({"torch": "sentence_transformers" in sys.modules, "threads": __import__("torch").get_num_threads()}))
"""


def test_the_torch_backend_loads_sentence_transformers_on_one_thread(db_url, tmp_path, monkeypatch):
    monkeypatch.setenv("COMPANION_EMBED_BACKEND", "torch")
    assert _run(_TORCH_PROBE, db_url=db_url, tmp_path=tmp_path) == {"torch": True, "threads": 1}
