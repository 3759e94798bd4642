"""Fit the conservative estimator's prices (``ESTIMATOR_PRICES``) with a linear program.

Usage::

    python scripts/fit_estimator.py [--data ../shared/data] [--seed 20240601] [--check-seed 7] [--raise-only]

What it does:

1. Builds the training texts: the five corpora of ``scripts/bench_tokens.py`` (MemoryBank-CN and
   LoCoMo messages read from ``--data``, generated JSON, Python and emoji chat); without
   ``--raise-only`` also chunks of the running Python's standard library and of installed
   packages' sources (litellm, rich) and of litellm's model-price JSON; and generated texts,
   40,000 of each: ASCII soup (random printable ASCII, letters with punctuation marks, letters
   with digits, base64 alphabet; 1-80 characters) and mixtures of character classes (the
   property tests' pieces: any code point, ASCII, letters and digits, table characters, Han,
   combining marks, whitespace, emoji).
2. Counts each text's :data:`runtime.accounting._estimator.FEATURES` and takes as "actual" the largest
   of the cl100k_base, o200k_base and DeepSeek counts.
3. Solves, with ``scipy.optimize.linprog`` (HiGHS), for prices ``p >= 0`` on the ASCII features that
   minimise the mean estimate / actual ratio (messages, code and JSON weighted 1 per corpus, the
   generated texts 0.05), subject to ``p . features + non_ascii_bound > actual - 1`` (the estimate
   is rounded up) for every training text, and ``> actual`` for the generated ones (a token of
   headroom, :data:`GENERATED_HEADROOM`). ``digit`` is held at its proven bound and
   ``digit_runs`` at or above its bound, ``control`` and ``ascii_next_to_non_ascii`` at one
   token per byte, and the sums of :data:`AT_LEAST` at or above their bounds (a space before a digit is
   one token, a run of spaces before a digit two; see ``ESTIMATOR_PRICES``). With
   ``--raise-only`` no price may fall below its current value, so no text's estimate can fall.
4. Multiplies the fitted prices (with ``--raise-only``, their rises) by 1.05, adds 0.5 to a
   raised ``text``, rounds each up to 0.001, and prints them as a Python dict to paste into
   ``runtime/accounting/_estimator.py``.
5. Checks the rounded prices on texts it was not fitted on, from ``--check-seed``: soup, repeated
   short soup (:func:`repeated_soup`, a known limit), mixtures, space-separated digits and aligned
   number columns, chunks of the standard library's and the training packages' sources (other
   chunks than the fit's), and of packages never fitted (sqlalchemy, pydantic, networkx, sympy),
   and prints the undercount share and the estimate / actual ratio of each, for the new and the
   current prices.

The exit status is 1 if the rounded prices still undercount a training text; the script stops
with a message if the LP has no solution. It runs for about 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import string
import sys
import sysconfig
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for folder in (REPO, REPO / "scripts"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from bench_tokens import DEFAULT_SEED, load_corpora, reference_counters, score  # noqa: E402

from runtime.accounting import _estimator as tokens  # noqa: E402

FIXED = {"digit": 0.334, "control": 1.0, "ascii_next_to_non_ascii": 1.0, "letters_between_marks": 1.0}
"""Prices held, not fitted (the bounds ``ESTIMATOR_PRICES`` documents)."""
LOWER = {"digit_runs": 0.667}
"""Lower bounds: ``ceil(n / 3) <= n / 3 + 2 / 3`` for a run of ``n`` digits."""
AT_LEAST = ((("space_runs", "space_digit"), 1.0), (("space_runs", "space_digit", "spaces_digit"), 2.0))
"""Groups of prices and the least their sum may be: a space before a digit is a token of its own in
all three tokenizers (their pre-tokenizers join a space to a following letter or mark, never to a
digit), and a run of 2 to about 80 spaces before a digit is two tokens in cl100k_base and o200k_base."""
UNPRICED = frozenset(tokens.FEATURES[tokens.FEATURES.index("latin2") : tokens.FEATURES.index("astral") + 1])
"""Non-ASCII class counts: priced by ``non_ascii_bound``, never by the fit."""
GENERATED = ("soup-", "mixtures")
GENERATED_WEIGHT = 0.05
"""Objective weight of the soup and mixture corpora (1 for the others): they bind as constraints,
but the ratio that is minimised is the one of messages, code and JSON."""
CEILING_SLACK = 0.999
"""The estimate is rounded up, so ``estimate > actual - 1`` is enough (less a little for rounding)."""
GENERATED_HEADROOM = 1.0
"""Tokens the generated soup and mixtures must be over-estimated by in the fit: random text varies
more than any sample of it, so the fit covers it with a token to spare."""
MARGIN = 1.05
TEXT_MARGIN = 0.5


def _chunks(text: str, rng: random.Random, lo: int = 40, hi: int = 2000) -> list[str]:
    out: list[str] = []
    at = 0
    while at < len(text):
        size = rng.randint(lo, hi)
        out.append(text[at : at + size])
        at += size
    return out


def source_chunks(rng: random.Random, packages: Sequence[str], files: int = 400, stdlib: bool = True) -> list[str]:
    """Chunks of Python files of the standard library and of ``packages`` (sorted paths, ``files`` sampled per root)."""
    roots = [Path(sysconfig.get_paths()["stdlib"])] if stdlib else []
    for name in packages:
        module = __import__(name)
        roots.append(Path(module.__file__).parent)
    texts: list[str] = []
    for root in roots:
        paths = sorted(
            p for p in root.rglob("*.py") if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts)
        )
        for path in rng.sample(paths, min(files, len(paths))):
            try:
                texts.extend(_chunks(path.read_text(encoding="utf-8"), rng))
            except (UnicodeDecodeError, OSError):
                continue
    return texts


def price_json_chunks(rng: random.Random) -> list[str]:
    """Chunks of litellm's bundled model-price JSON."""
    import litellm

    path = Path(litellm.__file__).parent / "model_prices_and_context_window_backup.json"
    return _chunks(path.read_text(encoding="utf-8"), rng)


TRAINING_PACKAGES = ("litellm", "rich")
HELD_OUT_PACKAGES = ("sqlalchemy", "pydantic", "networkx", "sympy")
"""Packages whose sources are only checked, never fitted (installed with the test extras)."""

SOUP_ALPHABETS = {
    "printable": [chr(c) for c in range(32, 127)],
    "letters+marks": list(string.ascii_letters + string.punctuation),
    "letters+digits": list(string.ascii_letters + string.digits),
    "base64": list(string.ascii_letters + string.digits + "+/="),
}


def soup(rng: random.Random, alphabet: Sequence[str], n: int, longest: int = 80) -> list[str]:
    """``n`` random strings over ``alphabet``, 1 to ``longest`` characters."""
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, longest))) for _ in range(n)]


def repeated_soup(rng: random.Random, n: int) -> list[str]:
    """``n`` short random ASCII strings (1-12 characters, printable or letters with marks), each
    repeated 2-4 times. Checked, not fitted: covering them (with a token of headroom or none) took a
    per-text price of 14.6 tokens, or with that price held, 0.336 tokens a lower-case letter (LoCoMo
    messages then cost 1.9 times their count)."""
    alphabets = [SOUP_ALPHABETS["printable"], SOUP_ALPHABETS["letters+marks"]]
    return [soup(rng, rng.choice(alphabets), 1, longest=12)[0] * rng.randint(2, 4) for _ in range(n)]


def mixtures(rng: random.Random, n: int) -> list[str]:
    """Concatenations of up to ten pieces of character classes, as the property tests draw them."""
    tabled = sorted(tokens._SAVING)

    def any_char() -> str:
        code = rng.choice((rng.randint(0, 127), rng.randint(0, 0xD7FF), rng.randint(0xE000, 0x10FFFF)))
        return chr(code)

    makers: list[Callable[[int], str]] = [
        lambda k: "".join(any_char() for _ in range(k)),
        lambda k: "".join(chr(rng.randint(0, 127)) for _ in range(k)),
        lambda k: "".join(rng.choice(string.ascii_letters + string.digits + " ") for _ in range(k)),
        lambda k: "".join(rng.choice(tabled) for _ in range(k)),
        lambda k: "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(k)),
        lambda k: "".join(chr(rng.randint(0x300, 0x36F)) for _ in range(min(k, 20))),
        lambda k: "".join(rng.choice(" \t\n\r") for _ in range(min(k, 20))),
        lambda k: "".join(chr(rng.randint(0x1F300, 0x1FAFF)) for _ in range(min(k, 20))),
    ]
    out = []
    for _ in range(n):
        text = "".join(rng.choice(makers)(rng.randint(0, 40)) for _ in range(rng.randint(1, 10)))
        if text:
            out.append(text)
    return out


GENERATED_TEXTS = 40_000
"""Generated training texts per soup alphabet, and mixtures: with 4,000, one held-out soup text in
1,000 to 4,000 was still undercounted by a token."""


def training_corpora(data: Path, seed: int, sources: bool) -> dict[str, list[str]]:
    """The five corpora of ``bench_tokens``, ``sources`` (when asked), then the generated soup and mixtures."""
    rng = random.Random(seed)
    corpora = dict(load_corpora(data, seed))
    if sources:
        corpora["sources"] = source_chunks(rng, TRAINING_PACKAGES)
        corpora["price-json"] = price_json_chunks(rng)
    for name, alphabet in SOUP_ALPHABETS.items():
        corpora[f"soup-{name}"] = soup(rng, alphabet, GENERATED_TEXTS)
    corpora["mixtures"] = mixtures(rng, GENERATED_TEXTS)
    return corpora


def spaced_numbers(rng: random.Random, n: int) -> dict[str, list[str]]:
    """Texts whose digits follow spaces, checked against the ``space_digit`` bound: lists of single
    digits and right-aligned columns of numbers."""
    return {
        "spaced-digits": [" ".join(str(rng.randint(0, 9)) for _ in range(rng.randint(1, 300))) for _ in range(n)],
        "aligned-columns": [
            "\n".join(
                "".join(str(rng.randint(0, 999)).rjust(rng.randint(4, 8)) for _ in range(8))
                for _ in range(rng.randint(1, 20))
            )
            for _ in range(n)
        ],
    }


def largest_counts(corpora: dict[str, list[str]]) -> dict[str, list[int]]:
    """Per corpus, each text's largest count of the three reference tokenizers (counted once, read by
    :func:`fit` and :func:`check`)."""
    counters = reference_counters().values()
    return {
        name: [max(column) for column in zip(*(count(texts) for count in counters), strict=True)]
        for name, texts in corpora.items()
    }


def fit(
    corpora: dict[str, list[str]], largest: dict[str, list[int]], floor: dict[str, float] | None = None
) -> dict[str, float]:
    """The LP's prices (before the margin), by feature name; none below ``floor`` (a price table) if given."""
    import numpy as np
    from scipy.optimize import linprog

    names = [name for name in tokens.FEATURES if name not in UNPRICED]
    where = [tokens.FEATURES.index(name) for name in names]
    need: dict[tuple[int, ...], float] = {}  # unique feature row -> largest (actual - non-ASCII bound)
    weight: dict[tuple[int, ...], float] = defaultdict(float)  # objective weight of each row
    for name, texts in corpora.items():
        share = GENERATED_WEIGHT if name.startswith(GENERATED) else 1.0
        for text, tokens_used in zip(texts, largest[name], strict=True):
            features = tokens.text_features(text)
            row = tuple(features[i] for i in where)
            # ceil(estimate) >= actual  <=>  estimate > actual - 1
            rest = tokens_used - tokens.non_ascii_bound(text) - CEILING_SLACK
            if name.startswith(GENERATED):
                rest += GENERATED_HEADROOM
            need[row] = max(need.get(row, -math.inf), rest)
            weight[row] += share / (len(texts) * max(1, tokens_used))
    rows = list(need)
    matrix = np.array(rows, dtype=float)
    cost = np.array([weight[row] for row in rows]) @ matrix
    floor = floor or {}
    bounds = [(FIXED[n], FIXED[n]) if n in FIXED else (max(LOWER.get(n, 0.0), floor.get(n, 0.0)), None) for n in names]
    groups = np.array([[1.0 if n in group else 0.0 for n in names] for group, _ in AT_LEAST])
    result = linprog(
        cost,
        A_ub=-np.vstack([matrix, groups]),
        b_ub=-np.concatenate([[need[row] for row in rows], [least for _, least in AT_LEAST]]),
        bounds=bounds,
        method="highs",
    )
    if result.status != 0:
        raise SystemExit(f"linprog failed: {result.message}")
    return dict(zip(names, map(float, result.x), strict=True))


def rounded(prices: dict[str, float], floor: dict[str, float] | None = None) -> dict[str, float]:
    """``prices`` with the margins, rounded up to 0.001. Above a ``floor`` only the rise gets the margins."""
    out = {}
    for name, value in prices.items():
        base = (floor or {}).get(name, 0.0)
        if name not in FIXED:
            value = base + (value - base) * MARGIN
        if name == "text" and value > base:
            value += TEXT_MARGIN
        out[name] = math.ceil(value * 1000 - 1e-9) / 1000
    for name, value in LOWER.items():
        out[name] = max(out[name], value)
    return out


def check(prices: dict[str, float], corpora: dict[str, list[str]], largest: dict[str, list[int]]) -> bool:
    """Print, per corpus, the undercount share and the sum ratio of ``prices``; True if none undercounted."""
    estimator = tokens.ConservativeEstimator(prices)
    clean = True
    for name, texts in corpora.items():
        if not texts:
            continue
        actual = largest[name]
        estimates = [estimator.count_text(t) for t in texts]
        under = [(t, e, a) for t, e, a in zip(texts, estimates, actual, strict=True) if e < a]
        clean = clean and not under
        share, ratio = score(estimates, actual)
        print(f"  {name:20s} {len(texts):6d} texts  undercount {share:6.3f}%  ratio {ratio:.3f}")
        for text, estimate, most in under[:3]:
            print(f"      {text!r}: {estimate} < {most}")
    return clean


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the training texts")
    parser.add_argument("--check-seed", type=int, default=7, help="seed of the held-out texts (not the training seed)")
    parser.add_argument(
        "--raise-only",
        action="store_true",
        help="keep every price at least its current value (a repair: no text's estimate can fall); "
        "the package sources are then only checked, not fitted",
    )
    args = parser.parse_args(argv)
    if args.check_seed == args.seed:
        parser.error("--check-seed must differ from --seed: the check is on texts the fit did not see")
    corpora = training_corpora(args.data, args.seed, sources=not args.raise_only)
    print("training texts:", {name: len(texts) for name, texts in corpora.items()})
    largest = largest_counts(corpora)
    floor = dict(tokens.ESTIMATOR_PRICES) if args.raise_only else None
    prices = rounded(fit(corpora, largest, floor), floor)
    print("ESTIMATOR_PRICES =", json.dumps(prices, indent=4))
    print("training texts, rounded prices:")
    covered = check(prices, corpora, largest)
    rng = random.Random(args.check_seed)
    held_out = {f"soup-{name}": soup(rng, alphabet, 20000) for name, alphabet in SOUP_ALPHABETS.items()}
    held_out["soup-repeated"] = repeated_soup(rng, 20000)
    held_out["mixtures"] = mixtures(rng, 20000)
    held_out.update(spaced_numbers(rng, 300))
    held_out["sources"] = source_chunks(rng, TRAINING_PACKAGES)
    held_out["other-packages"] = source_chunks(rng, HELD_OUT_PACKAGES, stdlib=False)
    held_out_largest = largest_counts(held_out)
    print(f"held-out texts (seed {args.check_seed}), rounded prices:")
    check(prices, held_out, held_out_largest)
    print("held-out texts, current ESTIMATOR_PRICES:")
    check(dict(tokens.ESTIMATOR_PRICES), held_out, held_out_largest)
    return 0 if covered else 1


if __name__ == "__main__":
    sys.exit(main())
