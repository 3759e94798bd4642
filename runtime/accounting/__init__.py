"""Token accounting: counters (exact tokenizers and the conservative estimator), budgets, calibration.
Exact where a tokenizer is available offline, never an undercount elsewhere. Pure: imports nothing
from ``memory``.

All counts in this module are **tokens** unless a name or docstring says characters or bytes.

Two kinds of :class:`TokenCounter`, both chosen by :func:`counter_for` from a litellm model name:

- **Exact counters** for the tokenizers that ship with litellm and load offline: OpenAI's
  ``cl100k_base`` and ``o200k_base`` (through ``tiktoken``; litellm bundles the files and
  :func:`runtime._offline.load_tiktoken` points ``TIKTOKEN_CACHE_DIR`` at them) and DeepSeek's
  tokenizer (``deepseek_tokenizer.json``, loaded with the Hugging Face ``tokenizers`` library). They
  count text exactly and add a safe message framing (OpenAI Cookbook, "How to count tokens with
  tiktoken": 3 tokens per message plus the role, 1 per name, 3 to prime the reply; we charge more).
- **The conservative estimator** (:class:`ConservativeEstimator`) for every other model, including an
  unknown model or ``None``. It prices text by character class in pure Python (byte-class translation
  and ``bytes.count``, no per-character loop), with prices fitted so that it does not undercount the
  largest of the cl100k_base, o200k_base and DeepSeek counts (see the class docstring and
  ``scripts/bench_tokens.py`` for the measurements).

Everything a request sends is counted: each message's framing and role, text and non-text content
parts (images and documents by provider rules, see :func:`openai_image_tokens` and
:func:`anthropic_image_tokens`), names, tool calls (function name and arguments), tool results and
their ids, and the tool schemas. Content that cannot be counted raises
:class:`errors.UncountableContentError` (an input error); nothing is ever counted as zero by default.

Tokenizers load lazily on first use and are cached (``functools.lru_cache``), so importing this package
imports neither litellm, tiktoken nor tokenizers.

The modules: ``_framing`` (per-message constants, :class:`TokenCounter`), ``_media`` (images and
documents), ``_walker`` (the message walker every counter shares, and the count caches),
``_estimator`` with its generated ``_tables``, ``_exact`` (the bundled tokenizers and
:func:`counter_for`), ``_budgets``, ``_calibration``.
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
from runtime.accounting._exact import counter_for, tiktoken_encoding
from runtime.accounting._framing import MESSAGE_FRAMING, REPLY_PRIMING, TokenCounter
from runtime.accounting._media import anthropic_image_tokens, openai_image_tokens
from runtime.accounting._prefix import longest_fitting_prefix, shared_prefix_tokens

__all__ = [
    "Baseline",
    "Budgets",
    "CALIBRATION_WINDOW",
    "CalibratedCounter",
    "MESSAGE_FRAMING",
    "MIN_CALIBRATION_TOKENS",
    "REPLY_PRIMING",
    "SOURCES",
    "TokenCounter",
    "anthropic_image_tokens",
    "baseline_total",
    "correction",
    "counter_for",
    "tiktoken_encoding",
    "fingerprint",
    "longest_fitting_prefix",
    "shared_prefix_tokens",
    "openai_image_tokens",
]
