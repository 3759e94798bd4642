"""Self-calibration and the provider's baseline.

After each response the provider's reported prompt tokens are compared with our
raw estimate of that request. The session's correction factor is the largest
reported/estimated ratio over its last :data:`CALIBRATION_WINDOW` responses: it rises when the
provider counts more than we estimate and falls when it counts less (a language our estimate
over-counts then gets the window it pays for), never below what any of those responses reported
(a report under :data:`MIN_FACTOR` of our estimate is not believed). Only requests of at least :data:`MIN_CALIBRATION_TOKENS` set the
factor: on a tiny request a fixed provider-side cost (a hidden system preamble) would look like a
huge ratio. That fixed cost is kept apart as an ``overhead`` in tokens, the largest amount any
sample's report exceeds its scaled estimate, and is added to every request.

A factor below 1 is only as good as the text it was measured on. It holds only while the ratios
of the last responses agree (:data:`STABLE_SPREAD`), and what a request adds since the provider
last counted one (the previous reply, the newest user message, what goes under it) may be in
another language, so assembly counts that at no less than the raw estimate
(:attr:`CalibratedCounter.conservative`).

The last reported usage is also a baseline: when the new request starts with the messages of the
last one before its newest user message (same fingerprint), its size is at most the reported
prompt tokens plus the raw estimate of the messages after that start (the reported count also
holds the previous newest message, which the new request sends again without what was under it).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.accounting._framing import TokenCounter

CALIBRATION_WINDOW = 5
"""Responses whose ratio sets the factor (our choice: recent enough to follow a model change)."""


def fingerprint(messages: Sequence[Mapping[str, Any]]) -> str:
    """SHA-256 of the messages' canonical JSON: equal lists give equal fingerprints."""
    data = json.dumps(
        [dict(m) for m in messages], sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str
    )
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


MIN_CALIBRATION_TOKENS = 256
"""Smallest raw estimate, in tokens, whose ratio may set the factor (our choice)."""

STABLE_SPREAD = 0.1
"""A factor below 1 holds only while the last responses' ratios agree within this share of it
(our choice): while the text's language mix moves, the largest ratio of past requests does not
bound the next one's, so the factor stays at 1 until the ratios settle."""

MIN_FACTOR = 0.25
"""The lowest reported/estimated ratio believed (our choice): below the 1/2.7 our estimate
over-counts Russian by, the most of any script we measured, so that a provider or proxy that
reports a made-up count cannot make us send four times what we count."""


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """How a session's estimates are corrected: ``ceil(raw × factor) + overhead`` tokens per request."""

    factor: float = 1.0
    """Multiplier on every estimate, >= :data:`MIN_FACTOR` (1.0 until the provider reports)."""
    overhead: int = 0
    """Tokens the provider adds per request beyond our scaled estimate, >= 0."""


def correction(samples: Sequence[tuple[int | None, int | None]]) -> Calibration:
    """The calibration from ``(reported, estimated)`` prompt-token pairs, newest first; a pair
    with a missing or non-positive count is left out."""
    valid = [(r, e) for r, e in samples if r and e and r > 0 and e > 0]
    # a report under MIN_FACTOR of our estimate is not believed (a proxy's or a fake's made-up
    # usage): it neither lowers the factor nor sets the overhead
    valid = [(r, e) for r, e in valid if r >= MIN_FACTOR * e]
    ratios = [r / e for r, e in valid if e >= MIN_CALIBRATION_TOKENS]
    factor = max(ratios) if ratios else 1.0
    if factor < 1.0 and max(ratios) - min(ratios) > STABLE_SPREAD * factor:
        factor = 1.0  # the ratio is moving (a language switch): not below our estimate until it settles
    overhead = max([0, *[r - math.ceil(e * factor) for r, e in valid]])
    return Calibration(factor=factor, overhead=overhead)


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """The last request the provider reported usage for."""

    fingerprint: str
    messages: int
    """How many messages that request had."""
    prompt_tokens: int
    """The provider's reported prompt tokens for it (exact)."""


class CalibratedCounter:
    """A :class:`~runtime.accounting.TokenCounter` whose counts are ``ceil(raw × factor)``, factor > 0."""

    def __init__(self, base: TokenCounter, factor: float) -> None:
        if not factor > 0:
            raise ValueError(f"A correction factor must be > 0, got {factor}.")
        self.base = base
        self.factor = factor
        self.name = f"{base.name}×{factor:.3f}" if factor != 1.0 else base.name

    @property
    def conservative(self) -> TokenCounter:
        """The counter for text the provider has not counted yet: this one, or the raw estimate
        when the factor is below 1 (a factor measured on other text may under-count it)."""
        return self if self.factor >= 1.0 else self.base

    def _scale(self, value: int) -> int:
        return value if self.factor == 1.0 else math.ceil(value * self.factor)

    def count_text(self, text: str) -> int:
        return self._scale(self.base.count_text(text))

    def count_message(self, message: Mapping[str, Any]) -> int:
        return self._scale(self.base.count_message(message))

    def count_messages(
        self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> int:
        return self._scale(self.base.count_messages(messages, tools=tools))


def baseline_total(
    baseline: Baseline | None, messages: Sequence[Mapping[str, Any]], counter: TokenCounter
) -> int | None:
    """Tokens of ``messages`` by the provider's baseline plus an estimate of what was added,
    or ``None`` when ``messages`` does not start with the baseline's request."""
    if baseline is None or len(messages) < baseline.messages:
        return None
    if fingerprint(messages[: baseline.messages]) != baseline.fingerprint:
        return None
    added = messages[baseline.messages :]
    return baseline.prompt_tokens + sum(counter.count_message(m) for m in added)
