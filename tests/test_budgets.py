"""Budgets and settings: typed, validated, scaled exactly."""

from __future__ import annotations

import pytest

from errors import ConfigurationError
from runtime.accounting import Budgets
from runtime.config import Settings


def test_default_budgets_match_the_design():
    b = Budgets.create()
    assert (b.persona, b.memory, b.retrieval, b.summary, b.recent) == (4000, 2000, 3000, 2000, 12000)
    assert b.total == 23000 + b.reply_reserve


@pytest.mark.parametrize("window", [pytest.param(w, id=str(w)) for w in (256, 1024, 4096, 8192, 128000)])
def test_scaled_budgets_total_exactly_the_window_and_keep_proportions(window):
    b = Budgets.create().scaled_to(window)
    assert b.total == window
    assert b.persona <= b.recent and b.memory <= b.retrieval
    assert all(getattr(b, s) >= 0 for s in ("persona", "memory", "retrieval", "summary", "recent"))


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"recent": -1}, id="negative"),
        pytest.param({"recent": 0}, id="zero-recent"),
        pytest.param({"memory": 1.5}, id="float"),
        pytest.param({"memroy": 10}, id="unknown-name"),
    ],
)
def test_bad_budget_raises_instead_of_being_fixed(values):
    with pytest.raises(ConfigurationError):
        Budgets.create(**values)


def test_settings_read_budgets_and_window_from_environment():
    s = Settings.from_env(
        {"COMPANION_BUDGET_RECENT": "5000", "COMPANION_CONTEXT_WINDOW": "8192", "DATABASE_URL": "postgresql://x/y"}
    )
    assert s.budgets.recent == 5000
    assert s.scaled_budgets.total == 8192
    assert s.database_url == "postgresql://x/y"


@pytest.mark.parametrize(
    "env, var",
    [
        pytest.param({"COMPANION_BUDGET_RECENT": "lots"}, "COMPANION_BUDGET_RECENT", id="not-a-number"),
        pytest.param({"COMPANION_CONTEXT_WINDOW": "100"}, "COMPANION_CONTEXT_WINDOW", id="window-too-small"),
        pytest.param({"COMPANION_LOG_LEVEL": "loud"}, "COMPANION_LOG_LEVEL", id="bad-log-level"),
    ],
)
def test_bad_setting_names_the_variable(env, var):
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env(env)
    assert var in str(info.value)
