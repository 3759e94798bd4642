"""Token accounting: counters (exact tokenizers and the conservative estimator), budgets, calibration.

Pure: imports nothing from ``memory``.
"""

from runtime.accounting._budgets import SOURCES, Budgets
from runtime.accounting._calibration import (
    CALIBRATION_WINDOW,
    MIN_CALIBRATION_TOKENS,
    Baseline,
    CalibratedCounter,
    baseline_total,
    correction,
    fingerprint,
)
from runtime.accounting._prefix import longest_fitting_prefix
from runtime.accounting._tokens import (
    MESSAGE_FRAMING,
    REPLY_PRIMING,
    FirstEstimator,
    TokenCounter,
    anthropic_image_tokens,
    counter_for,
    openai_image_tokens,
)

__all__ = [
    "Baseline",
    "Budgets",
    "CALIBRATION_WINDOW",
    "CalibratedCounter",
    "FirstEstimator",
    "MESSAGE_FRAMING",
    "MIN_CALIBRATION_TOKENS",
    "REPLY_PRIMING",
    "SOURCES",
    "TokenCounter",
    "anthropic_image_tokens",
    "baseline_total",
    "correction",
    "counter_for",
    "fingerprint",
    "longest_fitting_prefix",
    "openai_image_tokens",
]
