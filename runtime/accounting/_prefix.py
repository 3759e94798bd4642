"""The longest prefix that fits: the one binary search behind every cut-to-fit."""

from __future__ import annotations

import bisect
from collections.abc import Callable


def longest_fitting_prefix(length: int, fits: Callable[[int], bool], *, least: int = 0) -> int:
    """The largest ``n`` in ``[least, length]`` for which ``fits(n)`` holds.

    ``fits`` must be monotone: if a prefix of ``n`` characters fits, every shorter one
    does (true up to some ``n``, false after). ``least`` is returned without being tested
    when nothing longer fits, so a caller that must make progress passes ``least=1``.
    ``fits`` is called about ``log2(length - least)`` times (:func:`bisect.bisect_left`).
    """
    longer = range(least + 1, length + 1)
    return least + bisect.bisect_left(longer, True, key=lambda n: not fits(n))
