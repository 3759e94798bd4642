"""Token accounting: counters (exact tokenizers and the conservative estimator), budgets, calibration.

Pure: imports nothing from ``memory``.
"""

from runtime.accounting._budgets import Budgets, SOURCES
from runtime.accounting._prefix import longest_fitting_prefix
from runtime.accounting._calibration import Baseline, CALIBRATION_WINDOW, CalibratedCounter, MIN_CALIBRATION_TOKENS, baseline_total, correction, fingerprint
from runtime.accounting._tokens import FirstEstimator, MESSAGE_FRAMING, REPLY_PRIMING, TokenCounter, anthropic_image_tokens, counter_for, openai_image_tokens

__all__ = ['Baseline', 'Budgets', 'CALIBRATION_WINDOW', 'CalibratedCounter', 'FirstEstimator', 'MESSAGE_FRAMING', 'MIN_CALIBRATION_TOKENS', 'REPLY_PRIMING', 'SOURCES', 'TokenCounter', 'anthropic_image_tokens', 'baseline_total', 'correction', 'counter_for', 'fingerprint', 'longest_fitting_prefix', 'openai_image_tokens']
