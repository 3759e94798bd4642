"""The first estimator: a naive token count kept as a comparison baseline for
``scripts/bench_tokens.py`` (and a test that shows it undercounts Chinese)."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from runtime.accounting._walker import MessageCounter  # noqa: E402

_CJK = re.compile(
    "[\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002fa1f]"
)


class FirstEstimator(MessageCounter):
    """The first estimator, kept as a comparison baseline for the benchmark.

    Each Han, Kana or Hangul character counts as one token and all other text as ``ceil(chars / 4)``
    tokens (the common "4 characters per token" rule of thumb for English, OpenAI's tokenizer guide).
    It undercounts Chinese on cl100k_base and code/JSON on every tokenizer; see ``scripts/bench_tokens.py``.
    """

    name = "first-estimator"

    def count_text(self, text: str) -> int:
        """Tokens: one per Han/Kana/Hangul character plus ``ceil(other characters / 4)``."""
        if not text:
            return 0
        cjk = len(_CJK.findall(text))
        return cjk + math.ceil((len(text) - cjk) / 4)
