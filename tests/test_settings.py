"""Settings: read from the environment through pydantic-settings, bounds checked, bad values name the variable."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from errors import ConfigurationError
from runtime.config import Settings


@pytest.mark.parametrize(
    "values, var",
    [
        pytest.param({"model_retries": -1}, "COMPANION_MODEL_RETRIES", id="negative-retries"),
        pytest.param({"api_port": 70000}, "COMPANION_API_PORT", id="port-above-65535"),
        pytest.param({"summarizer": "abstractive"}, "COMPANION_SUMMARIZER", id="unknown-summarizer"),
        pytest.param({"database_url": 5}, "DATABASE_URL", id="url-not-text"),
    ],
)
def test_keyword_construction_checks_the_same_bounds_as_the_environment(values, var):
    with pytest.raises(ConfigurationError) as info:
        Settings(**values)
    assert info.value.setting == var and var in str(info.value)


def test_keywords_never_read_the_environment(monkeypatch):
    monkeypatch.setenv("COMPANION_MODEL", "openai/from-env")
    assert Settings().model == "gpt-4o-mini"
    assert Settings.from_env().model == "openai/from-env"


def test_blank_variables_keep_defaults_but_empty_ocr_languages_turns_ocr_off():
    settings = Settings.from_env(
        {"COMPANION_MODEL": "  ", "COMPANION_MODEL_RETRIES": "", "COMPANION_OCR_LANGUAGES": ""}
    )
    assert (settings.model, settings.model_retries, settings.ocr_languages) == ("gpt-4o-mini", 3, "")


def test_lists_paths_and_zero_cooldown_are_read_as_documented(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    settings = Settings.from_env(
        {
            "COMPANION_VISION_MODELS": "a, b,,c",
            "COMPANION_PERSONA": "~/aria.toml",
            "COMPANION_BREAKER_COOLDOWN": "0",
            "COMPANION_CLOSE_CRON": " 30  4 * * * ",
            "COMPANION_LOG_LEVEL": "DEBUG",
            "COMPANION_REPLY_RESERVE": "500",
        }
    )
    assert settings.vision_models == ("a", "b", "c")
    assert settings.persona_file == tmp_path / "aria.toml"
    assert (settings.breaker_cooldown, settings.close_cron, settings.log_level) == (None, "30 4 * * *", "debug")
    assert settings.budgets.reply_reserve == 500


def test_a_budget_the_budgets_refuse_names_its_variable():
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({"COMPANION_BUDGET_RECENT": "0"})
    assert info.value.setting == "COMPANION_BUDGET_RECENT"


def test_model_copy_derives_a_changed_frozen_copy():
    settings = Settings(context_window=4096)
    wider = settings.model_copy(update={"context_window": 8192})
    assert (settings.window, wider.window) == (4096, 8192)
    with pytest.raises(ValidationError):  # frozen
        settings.model = "other"  # type: ignore[misc]


def test_a_local_model_folder_is_one_model_however_it_is_spelled(tmp_path, monkeypatch):
    (tmp_path / "models" / "minilm").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    spellings = ["models/minilm/", "./models/minilm", "models//minilm", "models/minilm"]
    names = {Settings.from_env({"COMPANION_EMBEDDING_MODEL": s}).embedding_model for s in spellings}
    assert names == {"models/minilm"}
    hub = "sentence-transformers/all-MiniLM-L6-v2"  # not a folder here: a hub name, kept as given
    assert Settings(embedding_model=hub).embedding_model == hub
