"""Benchmark of token accounting: exact counters, the conservative estimator, naive rules.

Usage::

    python scripts/bench_tokens.py [--data ../shared/data] [--json out.json] [--repeat 3]

Corpora (each message is one text):

- ``memorybank-cn``: MemoryBank Chinese (``memorybank_cn/memory_bank_cn.json``), every query and
  every response. Read from ``--data``; never copied into the repository.
- ``locomo-en``: LoCoMo English (``locomo_dev7.json``), the ``text`` of every turn of every session.
- ``json-tools``: generated JSON tool results (nested objects, numbers, unicode, ids), serialised
  with and without ``ensure_ascii`` and with and without indentation.
- ``python-code``: generated Python functions and classes.
- ``emoji-chat``: generated chat lines mixing English, Chinese, emoji (ZWJ sequences, skin tones,
  flags, keycaps, variation selectors), symbols and kaomoji.

The generated corpora use a fixed seed (``--seed``, default 20240601), so every run sees the same texts.

For every tokenizer (cl100k_base, o200k_base, DeepSeek) and every corpus the table gives, per counter,
the share of messages undercounted (estimate < actual tokens) and the sum ratio estimate / actual.
"Actual" comes straight from tiktoken / ``tokenizers`` (not through ``runtime.accounting``). Only message
text is counted (``count_text``), no framing. Counters:

- ``exact``: ``counter_for(<model of that family>)``, the accounting the runtime uses for that model;
- ``estimator``: ``counter_for(None)``, the conservative estimator for unknown models;
- ``chars/4``, ``first`` (:class:`first_estimator.FirstEstimator`) and ``1.8han/0.3``: naive rules.

A ``vs max`` block compares each estimator with the largest of the three tokenizers' counts per
message. Throughput (MB/s of UTF-8 text) of ``exact`` and ``estimator`` is measured against
``litellm.token_counter(model=..., text=...)`` in the same run on the same texts. The targets are
checked at the end; the exit status is 1 if one is missed.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import string
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from first_estimator import FirstEstimator  # noqa: E402

from runtime._offline import load_litellm, load_tiktoken  # noqa: E402
from runtime.accounting import counter_for  # noqa: E402

DEFAULT_SEED = 20240601
FAMILY_MODELS = {"cl100k": "gpt-4", "o200k": "gpt-4o", "deepseek": "deepseek/deepseek-chat"}
"""The litellm model name used for each tokenizer family (for ``counter_for`` and ``litellm.token_counter``)."""

# ---------------------------------------------------------------------------------------------
# Corpora read from shared data
# ---------------------------------------------------------------------------------------------


def load_memorybank(data: Path) -> list[str]:
    """Every query and response of MemoryBank Chinese, in file order."""
    raw = json.loads((data / "memorybank_cn" / "memory_bank_cn.json").read_text(encoding="utf-8"))
    texts: list[str] = []
    for user in raw.values():
        for turns in user.get("history", {}).values():
            for turn in turns:
                for key in ("query", "response"):
                    if turn.get(key):
                        texts.append(str(turn[key]))
    return texts


def load_locomo(data: Path) -> list[str]:
    """The text of every turn of every LoCoMo session, in file order."""
    raw = json.loads((data / "locomo_dev7.json").read_text(encoding="utf-8"))
    texts: list[str] = []
    for sample in raw:
        conversation = sample["conversation"]
        sessions = sorted(
            (
                key
                for key, value in conversation.items()
                if re.fullmatch(r"session_\d+", key) and isinstance(value, list)
            ),
            key=lambda key: int(key.split("_")[1]),
        )
        for key in sessions:
            texts.extend(str(turn["text"]) for turn in conversation[key] if turn.get("text"))
    return texts


# ---------------------------------------------------------------------------------------------
# Generated corpora (fixed seed)
# ---------------------------------------------------------------------------------------------

_WORDS = (
    "time person year way day thing man world life hand part child eye woman place work week case point "
    "government company number group problem fact user session memory summary message token budget model "
    "request response result value status error count total price amount order customer product item "
    "address city country street weather temperature forecast humidity wind event calendar meeting "
    "reminder note friend family music movie book game travel flight hotel restaurant recipe coffee "
    "garden painting piano tea exercise health sleep mood dream weekend birthday holiday"
).split()
_ZH = (
    "今天天气很好 我们去公园散步吧 这本书非常有意思 你最近怎么样 我有点累了 周末一起吃饭 "
    "北京 上海 深圳 广州 成都 杭州 晴转多云 小雨 东南风三级 温度 湿度 空气质量 良 "
    "张伟 王芳 李娜 刘洋 陈静 会议室 提醒事项 生日快乐 谢谢你的帮助 没问题 好的 晚安 "
    "机器学习 数据库 服务器 用户名 密码错误 订单已发货 请稍后再试 鬱 龘 饕餮 麒麟 魑魅魍魉"
).split()
_ACCENTED = "café naïve résumé façade jalapeño Zürich São Paulo Kraków Ελλάδα Москва İstanbul Đà Nẵng Ærø".split()
_EMOJI_SIMPLE = list("😀😂🥲😍🤔😭😡👍👏🙏🔥✨🎉🎂🌧🌞🍜☕🐱🐶💯🚀📅📌✅❌⭐🌈🍀🎵")
_EMOJI_COMPLEX = [
    "❤️",
    "☺️",
    "✌️",
    "☀️",
    "⚠️",
    "👨‍👩‍👧‍👦",
    "🧑‍💻",
    "👩‍❤️‍👨",
    "🏳️‍🌈",
    "🏴‍☠️",
    "👍🏽",
    "👋🏻",
    "🙋🏿‍♀️",
    "🤷‍♂️",
    "🇨🇳",
    "🇺🇸",
    "🇯🇵",
    "🇫🇷",
    "1️⃣",
    "#️⃣",
    "🧑🏾‍🚀",
    "👩🏼‍🍳",
    "😶‍🌫️",
    "❤️‍🔥",
]
_SYMBOLS = list("★☆♪♫→←↑↓✓✗©®™°±×÷∞≈≠≤≥§¶•…※◆◇■□▲△○●") + [
    "¯\\_(ツ)_/¯",
    "(╯°□°)╯︵ ┻━┻",
    "(｡♥‿♥｡)",
    "╰(*°▽°*)╯",
    "^_^",
    ":-)",
    "<3",
    "xD",
]


def _ident(rng: random.Random, style: str = "snake") -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(1, 3))]
    if style == "camel":
        return words[0] + "".join(w.title() for w in words[1:])
    if style == "class":
        return "".join(w.title() for w in words)
    if style == "const":
        return "_".join(words).upper()
    return "_".join(words)


def _sentence(rng: random.Random, lo: int = 3, hi: int = 14) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))]
    return (" ".join(words)).capitalize() + rng.choice([".", "!", "?", "...", ""])


def _json_string(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.30:
        return _sentence(rng)
    if kind < 0.45:
        return "".join(rng.choice(_ZH) for _ in range(rng.randint(1, 4)))
    if kind < 0.52:
        return rng.choice(_ACCENTED) + " " + rng.choice(_ACCENTED)
    if kind < 0.58:
        return (
            _sentence(rng, 1, 4)
            + " "
            + "".join(rng.choice(_EMOJI_SIMPLE + _EMOJI_COMPLEX) for _ in range(rng.randint(1, 3)))
        )
    if kind < 0.66:
        return "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}".format(*tuple(rng.getrandbits(b) for b in (32, 16, 16, 16, 48)))
    if kind < 0.72:
        y, mo, d, h, mi, s = (
            rng.randint(1990, 2030),
            rng.randint(1, 12),
            rng.randint(1, 28),
            rng.randint(0, 23),
            rng.randint(0, 59),
            rng.randint(0, 59),
        )
        return f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}Z"
    if kind < 0.78:
        return f"https://api.example.com/v{rng.randint(1, 3)}/{rng.choice(_WORDS)}/{rng.randint(1, 99999)}?q={rng.choice(_WORDS)}&page={rng.randint(1, 50)}"
    if kind < 0.82:
        return "".join(rng.choice(string.hexdigits.lower()) for _ in range(rng.choice((12, 32, 40, 64))))
    if kind < 0.85:
        alphabet = string.ascii_letters + string.digits + "+/"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(16, 120)))
    if kind < 0.90:
        return rng.choice(_WORDS)
    if kind < 0.95:
        return f"{rng.choice(_WORDS)}_{rng.randint(0, 9999)}"
    return ""


def _json_number(rng: random.Random) -> int | float:
    kind = rng.random()
    if kind < 0.35:
        return rng.randint(0, 100)
    if kind < 0.55:
        return rng.randint(-(10**6), 10**9)
    if kind < 0.65:
        return rng.randint(10**12, 10**18)
    if kind < 0.85:
        return round(rng.uniform(-1000, 1000), rng.randint(1, 6))
    if kind < 0.95:
        return rng.random()
    return float(f"{rng.uniform(1, 9):.3f}e{rng.randint(-12, 20)}")


def _json_value(rng: random.Random, depth: int) -> object:
    kind = rng.random()
    if depth < 4 and kind < 0.22:
        return {
            _ident(rng, rng.choice(("snake", "camel"))): _json_value(rng, depth + 1) for _ in range(rng.randint(1, 6))
        }
    if depth < 4 and kind < 0.32:
        if rng.random() < 0.5:
            return [_json_number(rng) for _ in range(rng.randint(0, 12))]
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    if kind < 0.62:
        return _json_string(rng)
    if kind < 0.90:
        return _json_number(rng)
    return rng.choice((True, False, None))


def generate_json_tool_results(seed: int = DEFAULT_SEED, n: int = 800) -> list[str]:
    """Tool results as JSON text: nested objects, records, numbers, unicode, ids; mixed serialisations."""
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        shape = rng.random()
        if shape < 0.4:
            value: object = {_ident(rng): _json_value(rng, 1) for _ in range(rng.randint(1, 8))}
        elif shape < 0.7:
            fields = [_ident(rng, rng.choice(("snake", "camel"))) for _ in range(rng.randint(2, 6))]
            value = {
                "results": [{f: _json_value(rng, 3) for f in fields} for _ in range(rng.randint(1, 8))],
                "total": rng.randint(0, 5000),
            }
        elif shape < 0.85:
            value = [_json_value(rng, 2) for _ in range(rng.randint(1, 10))]
        else:
            value = {
                "status": rng.choice(("ok", "error")),
                "data": _json_value(rng, 1),
                "error": None if rng.random() < 0.6 else _sentence(rng),
            }
        indent = rng.choice((None, None, 2, 4))
        separators = (",", ":") if indent is None and rng.random() < 0.5 else None
        texts.append(json.dumps(value, ensure_ascii=bool(i % 2), indent=indent, separators=separators))
    return texts


def _py_expr(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.2:
        return str(rng.randint(0, 1000))
    if kind < 0.3:
        return repr(round(rng.uniform(-10, 10), rng.randint(1, 4)))
    if kind < 0.45:
        return repr(_sentence(rng, 1, 5))
    if kind < 0.55:
        return f'f"{{{_ident(rng)}}} {rng.choice(_WORDS)}: {{{_ident(rng)}!r}}"'
    if kind < 0.7:
        return f"{_ident(rng)}.{_ident(rng)}({_ident(rng)}, {rng.randint(0, 9)})"
    if kind < 0.8:
        return f"[{_ident(rng)} for {_ident(rng)} in {_ident(rng)} if {_ident(rng)} is not None]"
    if kind < 0.9:
        return "{" + ", ".join(f"{_ident(rng)!r}: {rng.randint(0, 99)}" for _ in range(rng.randint(1, 4))) + "}"
    return f"{_ident(rng)} {rng.choice(('+', '-', '*', '//', '%', '**', '==', '!=', '<=', 'and', 'or'))} {_ident(rng)}"


def _py_block(rng: random.Random, indent: int, depth: int) -> list[str]:
    pad = " " * indent
    lines = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.random()
        if kind < 0.35:
            lines.append(f"{pad}{_ident(rng)} = {_py_expr(rng)}")
        elif kind < 0.45:
            lines.append(f"{pad}# {_sentence(rng, 2, 10)}")
        elif kind < 0.6 and depth < 3:
            lines.append(f"{pad}if {_ident(rng)} {rng.choice(('>', '<', '==', 'is', 'in'))} {_py_expr(rng)}:")
            lines += _py_block(rng, indent + 4, depth + 1)
            if rng.random() < 0.4:
                lines.append(f"{pad}else:")
                lines += _py_block(rng, indent + 4, depth + 1)
        elif kind < 0.72 and depth < 3:
            lines.append(f"{pad}for {_ident(rng)}, {_ident(rng)} in enumerate({_ident(rng)}):")
            lines += _py_block(rng, indent + 4, depth + 1)
        elif kind < 0.8 and depth < 3:
            lines.append(f"{pad}try:")
            lines += _py_block(rng, indent + 4, depth + 1)
            lines.append(f"{pad}except ({_ident(rng, 'class')}Error, KeyError) as exc:")
            lines.append(f'{pad}    raise {_ident(rng, "class")}Error(f"{_sentence(rng, 2, 6)} {{exc}}") from exc')
        elif kind < 0.9:
            lines.append(
                f"{pad}{_ident(rng)}.{_ident(rng)}({', '.join(_py_expr(rng) for _ in range(rng.randint(0, 3)))})"
            )
        else:
            lines.append(f"{pad}return {_py_expr(rng)}")
    return lines


def _py_function(rng: random.Random, indent: int) -> list[str]:
    pad = " " * indent
    args = ", ".join(
        f"{_ident(rng)}: {rng.choice(('int', 'str', 'float', 'list[str]', 'dict[str, Any]', 'Sequence[int] | None'))}"
        for _ in range(rng.randint(0, 4))
    )
    if indent:
        args = "self" + (", " + args if args else "")
    lines = []
    if rng.random() < 0.2:
        lines.append(
            f"{pad}@{rng.choice(('staticmethod', 'lru_cache(maxsize=128)', 'property', 'pytest.mark.parametrize'))}"
        )
    lines.append(f"{pad}def {_ident(rng)}({args}) -> {rng.choice(('None', 'int', 'str', 'bool', 'list[int]'))}:")
    if rng.random() < 0.6:
        lines.append(f'{pad}    """{_sentence(rng, 4, 16)}"""')
    lines += _py_block(rng, indent + 4, 1)
    return lines


def generate_python_code(seed: int = DEFAULT_SEED, n: int = 500) -> list[str]:
    """Python snippets: imports, functions, classes, comments, literals, nested blocks."""
    rng = random.Random(seed + 1)
    texts = []
    for _ in range(n):
        lines: list[str] = []
        if rng.random() < 0.3:
            lines.append(f"from {_ident(rng)}.{_ident(rng)} import {_ident(rng, 'class')}, {_ident(rng)}")
            lines.append("")
        if rng.random() < 0.35:
            lines.append(
                f"class {_ident(rng, 'class')}({rng.choice(('object', 'Exception', 'BaseModel', 'Protocol'))}):"
            )
            lines.append(f'    """{_sentence(rng, 4, 12)}"""')
            lines.append("")
            for _ in range(rng.randint(1, 3)):
                lines += _py_function(rng, 4)
                lines.append("")
        else:
            if rng.random() < 0.3:
                lines.append(f"{_ident(rng, 'const')} = {_py_expr(rng)}")
            lines += _py_function(rng, 0)
        texts.append("\n".join(lines).rstrip() + "\n")
    return texts


def generate_emoji_chat(seed: int = DEFAULT_SEED, n: int = 1500) -> list[str]:
    """Chat lines with heavy emoji use: ZWJ sequences, skin tones, flags, keycaps, VS16, symbols, kaomoji."""
    rng = random.Random(seed + 2)
    texts = []
    for _ in range(n):
        pieces = []
        for _ in range(rng.randint(1, 6)):
            kind = rng.random()
            if kind < 0.3:
                pieces.append(_sentence(rng, 1, 8))
            elif kind < 0.45:
                pieces.append(
                    "".join(rng.choice(_ZH) for _ in range(rng.randint(1, 3)))
                    + rng.choice(("！", "～", "。", "？", ""))
                )
            elif kind < 0.65:
                pieces.append("".join(rng.choice(_EMOJI_SIMPLE) for _ in range(rng.randint(1, 5))))
            elif kind < 0.82:
                pieces.append("".join(rng.choice(_EMOJI_COMPLEX) for _ in range(rng.randint(1, 4))))
            elif kind < 0.92:
                pieces.append(rng.choice(_SYMBOLS) * rng.randint(1, 3))
            else:
                pieces.append(rng.choice(_EMOJI_SIMPLE) * rng.randint(3, 12))
        texts.append(rng.choice((" ", "", "  ", "\n")).join(pieces))
    return texts


def load_corpora(data: Path, seed: int) -> dict[str, list[str]]:
    """All five corpora, by name."""
    return {
        "memorybank-cn": load_memorybank(data),
        "locomo-en": load_locomo(data),
        "json-tools": generate_json_tool_results(seed),
        "python-code": generate_python_code(seed),
        "emoji-chat": generate_emoji_chat(seed),
    }


# ---------------------------------------------------------------------------------------------
# Reference tokenizers (straight from tiktoken / tokenizers, not through runtime.accounting)
# ---------------------------------------------------------------------------------------------


def reference_counters() -> dict[str, Callable[[Sequence[str]], list[int]]]:
    """Batch counters giving the actual tokens per text for each tokenizer family."""
    import os

    tiktoken = load_tiktoken()
    from tokenizers import Tokenizer

    folder = Path(os.environ["TIKTOKEN_CACHE_DIR"])
    deepseek = Tokenizer.from_file(str(folder / "deepseek_tokenizer.json"))
    cl100k = tiktoken.get_encoding("cl100k_base")
    o200k = tiktoken.get_encoding("o200k_base")
    return {
        "cl100k": lambda texts: [len(ids) for ids in cl100k.encode_ordinary_batch(list(texts))],
        "o200k": lambda texts: [len(ids) for ids in o200k.encode_ordinary_batch(list(texts))],
        "deepseek": lambda texts: [len(e.ids) for e in deepseek.encode_batch(list(texts), add_special_tokens=False)],
    }


def naive_counters() -> dict[str, Callable[[str], int]]:
    """The three naive rules the estimator is compared with."""
    first = FirstEstimator()
    han = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f]")

    def han_18_other_03(text: str) -> int:
        h = len(han.findall(text))
        return math.ceil(1.8 * h + 0.3 * (len(text) - h))

    return {
        "chars/4": lambda text: math.ceil(len(text) / 4),
        "first": first.count_text,
        "1.8han/0.3": han_18_other_03,
    }


def score(estimates: Sequence[int], actual: Sequence[int]) -> tuple[float, float]:
    """(share of texts with estimate < actual, in percent; sum of estimates / sum of actual)."""
    under = sum(1 for e, a in zip(estimates, actual, strict=False) if e < a)
    return 100.0 * under / len(actual), sum(estimates) / max(1, sum(actual))


def uncached(counter: object) -> Callable[[str], int]:
    """``counter``'s text count without its cache of repeated texts (``_CachedCounter``): each
    round of :func:`throughput` counts every text afresh, as a first sight of it would."""
    count = getattr(counter, "_count", None)
    return (lambda text: count(text) if text else 0) if count is not None else counter.count_text


def throughput(counters: Mapping[str, Callable[[str], int]], texts: Sequence[str], repeat: int) -> dict[str, float]:
    """MB/s (UTF-8 bytes) of each counter over ``texts``: best of ``repeat`` rounds, counters interleaved
    within each round so that machine load affects them alike."""
    size = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    best = {label: math.inf for label in counters}
    for count in counters.values():
        count(texts[0])
    for _ in range(repeat):
        for label, count in counters.items():
            start = time.perf_counter()
            for text in texts:
                count(text)
            best[label] = min(best[label], time.perf_counter() - start)
    return {label: size / seconds for label, seconds in best.items()}


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=REPO.parent / "shared" / "data",
        help="folder with memorybank_cn/ and locomo_dev7.json",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the generated corpora")
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs (best is kept)")
    args = parser.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    console = Console(width=150)
    corpora = load_corpora(args.data, args.seed)
    refs = reference_counters()
    actual = {fam: {name: refs[fam](texts) for name, texts in corpora.items()} for fam in FAMILY_MODELS}
    maximum = {name: [max(v) for v in zip(*(actual[f][name] for f in FAMILY_MODELS), strict=False)] for name in corpora}

    estimator = counter_for(None)
    exact = {fam: counter_for(model) for fam, model in FAMILY_MODELS.items()}
    naive = naive_counters()
    est_counts = {name: [estimator.count_text(t) for t in texts] for name, texts in corpora.items()}
    naive_counts = {
        label: {name: [f(t) for t in texts] for name, texts in corpora.items()} for label, f in naive.items()
    }

    results: dict[str, object] = {
        "corpora": {n: len(t) for n, t in corpora.items()},
        "accuracy": {},
        "throughput": {},
        "targets": [],
    }
    accuracy: dict[str, dict[str, dict[str, list[float]]]] = results["accuracy"]  # type: ignore[assignment]

    table = Table(
        title="Token accounting: undercount % of messages / sum ratio estimate÷actual (text only, no framing)"
    )
    table.add_column("tokenizer")
    table.add_column("counter")
    for name, texts in corpora.items():
        table.add_column(f"{name}\n({len(texts)} msgs)", justify="right")
    for fam in [*FAMILY_MODELS, "max"]:
        truth = maximum if fam == "max" else actual[fam]
        rows: dict[str, dict[str, list[int]]] = {}
        if fam != "max":
            rows[f"(a) exact {exact[fam].name}"] = {
                n: [exact[fam].count_text(t) for t in texts] for n, texts in corpora.items()
            }
        rows["(b) estimator"] = est_counts
        for label in naive:
            rows[f"(c) {label}"] = naive_counts[label]
        accuracy[fam] = {}
        for label, counts in rows.items():
            cells = []
            accuracy[fam][label] = {}
            for name in corpora:
                under, ratio = score(counts[name], truth[name])
                accuracy[fam][label][name] = [round(under, 3), round(ratio, 4)]
                cells.append(f"{under:5.2f}% / {ratio:.3f}")
            table.add_row(
                fam if label.startswith(("(a)", "(b)")) and (fam == "max" or label.startswith("(a)")) else "",
                label,
                *cells,
            )
        table.add_section()
    console.print(table)

    # Throughput on all texts of all corpora, in the same run.
    litellm = load_litellm()

    all_texts = [t for texts in corpora.values() for t in texts]
    speed = Table(
        title=f"Throughput, MB/s of UTF-8 text ({len(all_texts)} texts, {sum(len(t.encode()) for t in all_texts) / 1e6:.2f} MB, best of {args.repeat})"
    )
    for col in ("tokenizer", "litellm.token_counter", "(a) exact", "(b) estimator", "(a)/litellm", "(b)/litellm"):
        speed.add_column(col, justify="right")
    throughput_results: dict[str, dict[str, float]] = results["throughput"]  # type: ignore[assignment]
    for fam, model in FAMILY_MODELS.items():
        measured = throughput(
            {
                "litellm": lambda t, m=model: litellm.token_counter(model=m, text=t),
                "exact": uncached(exact[fam]),
                "estimator": uncached(estimator),
            },
            all_texts,
            args.repeat,
        )
        lit, ex, est_speed = measured["litellm"], measured["exact"], measured["estimator"]
        throughput_results[fam] = {"litellm": round(lit, 3), "exact": round(ex, 3), "estimator": round(est_speed, 3)}
        speed.add_row(fam, f"{lit:.2f}", f"{ex:.2f}", f"{est_speed:.2f}", f"{ex / lit:.2f}x", f"{est_speed / lit:.2f}x")
    console.print(speed)

    # Targets.
    targets: list[tuple[str, bool]] = []
    for fam in FAMILY_MODELS:
        label = f"(a) exact {exact[fam].name}"
        for name in corpora:
            under, ratio = accuracy[fam][label][name]
            targets.append(
                (
                    f"(a) {fam:8s} {name:13s}: undercount {under:.2f}% == 0, ratio {ratio:.3f} <= 1.05",
                    under == 0 and ratio <= 1.05,
                )
            )
    for name in corpora:
        under, ratio = accuracy["max"]["(b) estimator"][name]
        targets.append(
            (
                f"(b) vs max   {name:13s}: undercount {under:.3f}% <= 0.1%, ratio {ratio:.3f} <= 1.3",
                under <= 0.1 and ratio <= 1.3,
            )
        )
    for fam, t in throughput_results.items():
        targets.append(
            (
                f"(b) speed {fam:8s}: {t['estimator']:.2f} MB/s >= 2 x litellm {t['litellm']:.2f}",
                t["estimator"] >= 2 * t["litellm"],
            )
        )
        targets.append(
            (f"(a) speed {fam:8s}: {t['exact']:.2f} MB/s >= litellm {t['litellm']:.2f}", t["exact"] >= t["litellm"])
        )
    console.print("[bold]Targets[/bold]")
    for text, ok in targets:
        console.print(f"  {'PASS' if ok else 'FAIL'}  {text}", markup=False, highlight=False)
    results["targets"] = [{"target": text, "pass": ok} for text, ok in targets]
    passed = all(ok for _, ok in targets)
    console.print(f"{'ALL TARGETS MET' if passed else 'SOME TARGETS MISSED'}", markup=False)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, ensure_ascii=False), encoding="utf-8")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
