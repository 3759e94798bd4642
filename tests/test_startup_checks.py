"""What can be checked when the runtime opens is checked then, with the message a turn would give,
instead of at every turn: a persona too big for its budget, a lorebook regex that does not compile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from errors import ConfigurationError, PersonaError
from runtime.config import Settings
from runtime.service import open_engine

REPO = Path(__file__).resolve().parents[1]


def _persona_file(tmp_path: Path, *, prompt_words: int, key: str = "lamp") -> Path:
    path = tmp_path / "big.toml"
    prompt = " ".join(f"rule{i}" for i in range(prompt_words))
    path.write_text(
        f'name = "Mira"\nsystem_prompt = "{prompt}"\n\n[character_book]\n'
        f"entries = [{{keys = ['{key}'], content = 'Old lamp.'}}]\n",
        encoding="utf-8",
    )
    return path


def test_a_persona_too_big_for_its_budget_is_refused_when_the_engine_opens(tmp_path, db_url, embedder):
    settings = Settings(
        database_url=db_url, context_window=2048, persona_file=_persona_file(tmp_path, prompt_words=3000)
    )
    with pytest.raises(ConfigurationError) as info:
        open_engine(settings, with_model=False, embedder=embedder)
    assert info.value.setting == "COMPANION_BUDGET_PERSONA" and "never cut" in str(info.value)
    fits = Settings(database_url=db_url, context_window=2048, persona_file=_persona_file(tmp_path, prompt_words=20))
    engine = open_engine(fits, with_model=False, embedder=embedder)
    try:
        assert engine.persona.name == "Mira"
    finally:
        engine.file_services.close()


def test_a_lorebook_regex_that_does_not_compile_is_refused_when_the_engine_opens(tmp_path, db_url, embedder):
    settings = Settings(database_url=db_url, persona_file=_persona_file(tmp_path, prompt_words=5, key="/(unclosed/"))
    with pytest.raises(PersonaError) as info:
        open_engine(settings, with_model=False, embedder=embedder)
    assert "does not compile" in str(info.value) and "keys[0]" in (info.value.field or "")


def test_a_command_refuses_to_start_with_a_persona_too_big_and_says_why_in_one_line(tmp_path, empty_db_url):
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DATABASE_URL": empty_db_url,
        "COMPANION_PERSONA": str(_persona_file(tmp_path, prompt_words=3000)),
        "COMPANION_CONTEXT_WINDOW": "2048",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    done = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "replay", str(REPO / "scripts/data/sample_conversation.json")],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "COMPANION_BUDGET_PERSONA" in done.stderr and len(done.stderr.strip().splitlines()) == 1
