"""Prefixes: the longest one that fits (the one binary search behind every cut-to-fit), and the one
two requests share (what a provider's prompt cache can reuse)."""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from runtime.accounting._framing import TokenCounter


def longest_fitting_prefix(length: int, fits: Callable[[int], bool], *, least: int = 0) -> int:
    """The largest ``n`` in ``[least, length]`` for which ``fits(n)`` holds.

    ``fits`` must be monotone: if a prefix of ``n`` characters fits, every shorter one
    does (true up to some ``n``, false after). ``least`` is returned without being tested
    when nothing longer fits, so a caller that must make progress passes ``least=1``.
    ``fits`` is called about ``log2(length - least)`` times (:func:`bisect.bisect_left`).
    """
    longer = range(least + 1, length + 1)
    return least + bisect.bisect_left(longer, True, key=lambda n: not fits(n))


def shared_prefix_tokens(
    previous: Sequence[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]], counter: TokenCounter
) -> int:
    """Tokens (by ``counter``) of what ``messages`` shares with the start of ``previous``: the
    messages both start with, whole, then the common start of the first text that differs (same
    role): what a provider's prefix cache could reuse of ``messages`` after ``previous``."""
    shared: list[Mapping[str, Any]] = []
    for old, new in zip(previous, messages, strict=False):
        if old == new:
            shared.append(new)
            continue
        a, b = old.get("content"), new.get("content")
        if old.get("role") == new.get("role") and isinstance(a, str) and isinstance(b, str):
            common = os.path.commonprefix([a, b])
            if common:
                return (counter.count_messages(shared) if shared else 0) + counter.count_text(common)
        break
    return counter.count_messages(shared) if shared else 0
