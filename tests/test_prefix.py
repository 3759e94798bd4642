"""The one binary search behind every cut-to-fit: the longest prefix that fits, found in log time."""

from __future__ import annotations

import pytest

from runtime.accounting import counter_for, longest_fitting_prefix


@pytest.mark.parametrize("length", [0, 1, 2, 7, 64, 1000])
@pytest.mark.parametrize("least", [0, 1])
def test_matches_a_linear_scan_for_every_threshold(length, least):
    for threshold in range(-1, length + 2):
        calls: list[int] = []

        def fits(n: int, calls: list[int] = calls, threshold: int = threshold) -> bool:
            calls.append(n)
            return n <= threshold

        expected = max([least, *[n for n in range(least, length + 1) if n <= threshold]])
        assert longest_fitting_prefix(length, fits, least=least) == min(expected, max(length, least))
        assert least not in calls  # ``least`` itself is never tested ...
        assert len(calls) <= max(length, 1).bit_length() + 1  # ... and the search is logarithmic


def test_cuts_text_to_a_token_limit():
    counter = counter_for("gpt-4o")
    text = "The quick brown fox jumps over the lazy dog. " * 20
    cut = longest_fitting_prefix(len(text), lambda n: counter.count_text(text[:n]) <= 30)
    assert counter.count_text(text[:cut]) <= 30 < counter.count_text(text[: cut + 1])
