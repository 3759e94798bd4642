"""Replay: feed a stored conversation through the engine, turn by turn, and measure it.

Two input formats:

- LoCoMo JSON (Maharana et al., 2024): a list of conversations; ``speaker_a`` is the
  user and ``speaker_b`` the companion; each ``session_N_date_time`` is the time of
  that session's turns; ``qa`` items carry evidence turn ids (``D<session>:<turn>``).
- JSONL: one ``{"role", "content", "timestamp"}`` object per line (ISO 8601 timestamp).

The assistant replies come from the file; no model is called.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import structlog

from errors import ConfigurationError, InvalidFieldError, InvalidMessageError
from memory.archive import USER_LABEL
from memory.embeddings import CachingEmbedder, Embedder
from memory.tables import TurnState
from persona import Persona
from runtime.accounting import shared_prefix_tokens
from runtime.context import AssembledContext, without_names
from runtime.turn import Engine, InlineCompaction, validate_message

log = structlog.get_logger("companion.replay")

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
"""LoCoMo QA categories with evidence; 5 (adversarial) has none to count."""

PREFETCH_TURNS = 64
"""Turns whose texts a replay embeds ahead in one call (each turn's text once), on a thread of its
own while the turns before them run (:class:`_Ahead`)."""


@dataclass(frozen=True, kw_only=True)
class SourceTurn:
    role: str
    """``user`` or ``assistant``."""
    text: str
    at: datetime
    turn_id: str | None = None
    """The source's id for the turn (LoCoMo ``dia_id``), if any."""


@dataclass(frozen=True, kw_only=True)
class QAItem:
    question: str
    evidence: list[str]
    category: int


@dataclass(kw_only=True)
class Conversation:
    id: str
    user_name: str
    companion_name: str
    sessions: int
    turns: list[SourceTurn]
    qa: list[QAItem] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class TurnPoint:
    """The replay's state after one step (a user turn with its reply, or one lone turn)."""

    turn: int
    """Turns stored so far (the step's last turn, 1-based)."""
    sources: dict[str, int] | None
    """Tokens by source of the context the reply was made from; ``None`` for a lone turn (no reply, no context)."""
    total_tokens: int | None
    """That context's estimated size, tokens (framing, priming and overhead included)."""
    reply_reserve: int
    """Tokens kept free for the reply."""
    compactions: int
    """Successful compactions of the session so far."""
    compaction_failures: int
    """Consecutive failed compactions at this point (the breaker's count)."""
    archived_segments: int
    """Archived segments of the replay's user so far."""
    summary_tokens: int
    """Tokens of the session's summary at this point (0 before the first compaction)."""


@dataclass(kw_only=True)
class ReplayReport:
    """Figures of one replayed conversation. Token figures are tokens; times are seconds."""

    conversation: str
    window: int
    turns: int = 0
    sessions: int = 0
    compactions: int = 0
    compaction_failures: int = 0
    archived_segments: int = 0
    summary_tokens: int = 0
    largest_context: int = 0
    """Largest assembled prompt plus the reply reserve, tokens."""
    overflows: int = 0
    """Assembled contexts whose prompt plus reply reserve exceeded the window."""
    prompt_tokens: int = 0
    """Tokens of every reply's request, summed (the engine's count)."""
    shared_tokens: int = 0
    """Of those, the tokens each request shares with the start of the one before it (what a
    provider's prompt cache could reuse: :func:`runtime.accounting.shared_prefix_tokens`)."""
    user_turns: int = 0
    """User turns stored by the replay."""
    user_turns_recoverable: int = 0
    """User turns found verbatim in the recent window, the summary or an archived segment."""
    evidence_total: dict[str, int] = field(default_factory=dict)
    evidence_in_context: dict[str, int] = field(default_factory=dict)
    evidence_retrieval: dict[str, int] = field(default_factory=dict)
    wall_seconds: float = 0.0
    user_id: str = ""
    session_id: str = ""
    timeline: list[TurnPoint] = field(default_factory=list)
    """One point per replayed step, in order (for ``companion replay --plot``)."""

    @property
    def prefix_share(self) -> float | None:
        """``shared_tokens / prompt_tokens``, or ``None`` before any reply."""
        return self.shared_tokens / self.prompt_tokens if self.prompt_tokens else None

    def recall(self, which: str, category: str = "all") -> float | None:
        """Evidence recall as a fraction, ``which`` is ``in_context`` or ``retrieval``."""
        total = self.evidence_total.get(category, 0)
        found = (self.evidence_in_context if which == "in_context" else self.evidence_retrieval).get(category, 0)
        return found / total if total else None

    def as_dict(self) -> dict:
        data = {k: v for k, v in self.__dict__.items()}
        data["timeline"] = [asdict(p) for p in self.timeline]
        data["prefix_share"] = self.prefix_share
        data["evidence_recall"] = {
            cat: {"in_context": self.recall("in_context", cat), "retrieval_only": self.recall("retrieval", cat), "n": n}
            for cat, n in self.evidence_total.items()
        }
        return data


LOCOMO_DATE = "%I:%M %p on %d %B, %Y"


def _parse_locomo_date(raw: str) -> datetime:
    try:
        return datetime.strptime(raw.strip(), LOCOMO_DATE).replace(tzinfo=UTC)
    except ValueError:
        raise ConfigurationError(
            f"Unrecognised LoCoMo date {raw!r} (expected like '1:56 pm on 8 May, 2023')."
        ) from None


def _locomo_text(turn: dict) -> str:
    text = str(turn.get("text", ""))
    caption = turn.get("blip_caption")
    if caption:
        text = f"{text} [shares a photo: {caption}]".strip()
    return text


def load_locomo(data: list, conversation: str | None = None) -> list[Conversation]:
    out = []
    for item in data:
        if conversation and item.get("sample_id") != conversation:
            continue
        conv = item["conversation"]
        user, companion = conv["speaker_a"], conv["speaker_b"]
        numbers = sorted(
            int(m.group(1)) for k in conv if (m := re.fullmatch(r"session_(\d+)", k)) and isinstance(conv[k], list)
        )
        turns: list[SourceTurn] = []
        for n in numbers:
            start = _parse_locomo_date(conv[f"session_{n}_date_time"])
            for i, t in enumerate(conv[f"session_{n}"]):
                role = "user" if t["speaker"] == user else "assistant"
                turns.append(
                    SourceTurn(
                        role=role, text=_locomo_text(t), at=start + timedelta(seconds=30 * i), turn_id=t.get("dia_id")
                    )
                )
        qa = []
        for q in item.get("qa", []):
            ids = [e for raw in q.get("evidence", []) for e in re.split(r"[;,\s]+", str(raw)) if e]
            qa.append(QAItem(question=str(q["question"]), evidence=ids, category=int(q.get("category", 0))))
        out.append(
            Conversation(
                id=item.get("sample_id", "conversation"),
                user_name=str(user),
                companion_name=str(companion),
                sessions=len(numbers),
                turns=turns,
                qa=qa,
            )
        )
    if conversation and not out:
        known = ", ".join(str(i.get("sample_id")) for i in data)
        raise ConfigurationError(
            f"No conversation {conversation!r} in the file; it has: {known}.", setting="--conversation"
        )
    return out


def load_jsonl(lines: Iterable[str], name: str) -> Conversation:
    turns = []
    dates = set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            role, content = obj["role"], obj["content"]
            if not isinstance(content, str):
                raise TypeError(f"content must be a string, got {type(content).__name__}")
            at = datetime.fromisoformat(obj["timestamp"]) if obj.get("timestamp") else datetime.now(UTC)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(
                f'Line {number} of {name} is not a {{"role", "content", "timestamp"}} object ({type(exc).__name__}: {exc}).'
            ) from None
        if role not in ("user", "assistant"):
            raise ConfigurationError(f"Line {number} of {name}: role must be user or assistant, got {role!r}.")
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        dates.add(at.date())
        turns.append(SourceTurn(role=role, text=str(content), at=at, turn_id=str(number)))
    if not turns:
        raise ConfigurationError(f'{name} has no turns; give one {{"role", "content", "timestamp"}} object per line.')
    return Conversation(
        id=Path(name).stem[:80], user_name="User", companion_name="Companion", sessions=len(dates), turns=turns
    )


def load_conversations(path: Path, conversation: str | None = None) -> list[Conversation]:
    """Read a LoCoMo ``.json`` file or a ``.jsonl`` file.

    The file is UTF-8; a leading byte order mark is ignored and lines may end in LF or CRLF.

    Raises:
        ConfigurationError: a missing file, an unknown format, or a malformed record.
    """
    try:
        data_bytes = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigurationError(f"No such file: {path}", setting="PATH") from None
    except OSError as exc:
        raise ConfigurationError(f"Cannot read {path}: {exc.strerror or exc}", setting="PATH") from None
    try:
        # utf-8-sig: a leading byte order mark (as Windows editors write) is dropped, not parsed
        raw = data_bytes.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data_bytes[: exc.start].count(b"\n") + 1
        raise ConfigurationError(
            f"{path} is not valid UTF-8: byte {exc.start} (line {line}) cannot be decoded. Re-encode the file as UTF-8.",
            setting="PATH",
        ) from None
    if str(path).lower().endswith(".jsonl"):
        return [load_jsonl(raw.splitlines(), str(path))]
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{path} is not valid JSON ({exc}); give a LoCoMo .json or a .jsonl file.") from None
    if not isinstance(data, list) or not all(isinstance(i, dict) and "conversation" in i for i in data):
        raise ConfigurationError(f"{path} is not a LoCoMo file (a list of objects with 'conversation').")
    try:
        conversations = load_locomo(data, conversation)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ConfigurationError(
            f"{path} is not a well-formed LoCoMo file: missing or malformed field {exc}. "
            "Each conversation needs speaker_a, speaker_b, session_N lists of {speaker, dia_id, text} "
            "and session_N_date_time."
        ) from None
    if not any(c.turns for c in conversations):
        raise ConfigurationError(f"{path} has no turns to replay.")
    return conversations


def replay_conversation(
    engine: Engine,
    conv: Conversation,
    *,
    on_turn: Callable[[], None] | None = None,
    run_id: str | None = None,
    on_context: Callable[[AssembledContext], None] | None = None,
) -> ReplayReport:
    """Replay one conversation into a fresh user and session, then evaluate its QA items.

    ``on_turn`` is called once per turn replayed; ``on_context`` with the context each reply was
    requested with (the request the model would get), in order."""
    started = time.perf_counter()
    for number, t in enumerate(conv.turns, 1):
        try:
            validate_message(t.text, max_chars=engine.settings.max_message_chars)
        except InvalidMessageError as exc:
            where = t.turn_id or number
            raise InvalidMessageError(
                f"Turn {where} of conversation {conv.id!r} cannot be replayed: {exc} Nothing was stored.",
                reason=exc.reason,
                position=exc.position,
            ) from None
    run_id = run_id or uuid.uuid4().hex[:8]
    user_id = f"replay:{conv.id}:{run_id}"
    session_id = f"{user_id}:session"
    persona = Persona(
        name=conv.companion_name,
        system_prompt=f"You are {conv.companion_name}, a friend of {conv.user_name}. Talk with {conv.user_name} warmly and remember what they share.",
    )
    engine = engine.derive(persona=persona)
    profile = None
    if conv.user_name != USER_LABEL:
        # the user's display name, pinned as an app would, so recall knows whom a question names
        try:
            profile = engine.profiles.set(user_id, name=conv.user_name)
        except InvalidFieldError as exc:  # e.g. over the profile's 200 characters: replay without it
            log.warning("replay.user_name_not_pinned", conversation=conv.id, reason=exc.reason)
    names = list(engine.gatherer.speaker_names(profile, persona))  # the names the engine strips from messages
    report = ReplayReport(
        conversation=conv.id, window=engine.window, sessions=conv.sessions, user_id=user_id, session_id=session_id
    )
    turns = conv.turns
    cache = engine.embedder if isinstance(engine.embedder, CachingEmbedder) else None
    blocks = _ahead_texts(conv, names)
    # ahead, on a thread of its own, while the turns run: each block of turns' texts, then the
    # questions; a turn waits for its block, so it finds its vector in the cache
    ahead = _Ahead(cache, [*blocks, _questions(conv, names)]) if cache is not None else None
    inline = isinstance(engine.runner.scheduler, InlineCompaction)
    previous_request: list = []
    try:
        i = 0
        while i < len(turns):
            if ahead is not None:
                ahead.wait(i // PREFETCH_TURNS)
            t = turns[i]
            context = None
            # the stored state the timeline reads changes only by a compaction; with compaction
            # inline, a turn that ran none leaves it as the previous point saw it
            changed = True
            if t.role == "user" and i + 1 < len(turns) and turns[i + 1].role == "assistant":
                result = engine.turn(
                    user_id=user_id, session_id=session_id, message=t.text, at=t.at, reply=turns[i + 1].text
                )
                context = result.context
                _track(report, context)
                report.prompt_tokens += engine.counter.count_messages(context.messages)
                report.shared_tokens += shared_prefix_tokens(previous_request, context.messages, engine.counter)
                previous_request = context.messages
                if on_context is not None:
                    on_context(context)
                changed = bool(result.compactions) or not inline
                step = 2
            else:
                engine.add_turn(user_id=user_id, session_id=session_id, role=t.role, content=t.text, at=t.at)
                step = 1
            report.turns += step
            i += step
            previous = report.timeline[-1] if report.timeline and not changed else None
            report.timeline.append(_point(engine, report, context, previous))
            if on_turn:
                for _ in range(step):
                    on_turn()
        if ahead is not None:
            ahead.wait(len(blocks))  # the questions
    finally:
        if ahead is not None:
            ahead.stop()
    state = engine.store.compaction.state(session_id)
    report.compactions = state.compactions
    report.compaction_failures = state.consecutive_failures
    report.archived_segments = engine.store.archive.count(user_id=user_id)
    summary = engine.store.compaction.summary(session_id)
    report.summary_tokens = summary.tokens if summary else 0
    report.user_turns, report.user_turns_recoverable = user_turn_coverage(engine, session_id)
    _evaluate(engine, conv, report)
    report.wall_seconds = time.perf_counter() - started
    return report


def _ahead_texts(conv: Conversation, names: list[str]) -> list[list[str]]:
    """The texts the replay of ``conv`` will embed, per :data:`PREFETCH_TURNS` turns: each turn's
    text, once, shortest first (the model's passes then join texts of about one length and pad
    little, ``docs/decisions/measurements.md#replay-embeds-ahead``). A user turn's (without the speakers'
    ``names``, :func:`memory.recall.without_names`) is its recall query, stored with it; the others' are
    embedded by the compaction that archives them; archive keys and enriched queries are composed
    from these vectors (:func:`memory.archive.key_vectors`), so nothing else is embedded."""
    texts = [without_names(t.text, names) if t.role == "user" else t.text for t in conv.turns]
    return [
        sorted(dict.fromkeys(texts[start : start + PREFETCH_TURNS]), key=len)
        for start in range(0, len(texts), PREFETCH_TURNS)
    ]


def _questions(conv: Conversation, names: list[str]) -> list[str]:
    """The distinct texts :func:`_evaluate` embeds, shortest first: the questions of a category with
    evidence, as a user's message is embedded (without the speakers' ``names``)."""
    asked = [qa.question for qa in conv.qa if qa.category in CATEGORIES]
    return sorted(dict.fromkeys(without_names(q, names) for q in asked), key=len)


class _Ahead:
    """Embeds blocks of texts into a :class:`~memory.embeddings.CachingEmbedder`, in order, on a
    thread of its own (:func:`_prefetch` each), so the model works while the replay's turns do
    their database work. The calls, and so the vectors, are the ones a replay that waited for
    each block in turn would make. :meth:`wait` blocks until a block is in the cache;
    :meth:`stop` lets the thread end after the block it is embedding.

    Raises (from :meth:`wait`): whatever the embedder raised for that block or an earlier one.
    """

    def __init__(self, embedder: CachingEmbedder, blocks: list[list[str]]) -> None:
        self._embedder = embedder
        self._blocks = blocks
        self._done = [threading.Event() for _ in blocks]
        self._error: BaseException | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="companion-replay-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for block, done in zip(self._blocks, self._done, strict=True):
            if self._stopped.is_set():
                break
            try:
                _prefetch(self._embedder, block)
            except BaseException as exc:  # raised in the replay's thread by wait()
                self._error = exc
                break
            done.set()
        for done in self._done:  # nothing more comes: no waiter stays blocked
            done.set()

    def wait(self, block: int) -> None:
        """Return once block number ``block`` (0-based) is embedded."""
        self._done[block].wait()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        self._stopped.set()


def _prefetch(embedder: Embedder, texts: list[str]) -> None:
    """Embed ``texts`` into ``embedder``'s cache, :data:`PREFETCH_TURNS` texts per call."""
    for start in range(0, len(texts), PREFETCH_TURNS):
        embedder.embed(texts[start : start + PREFETCH_TURNS])


def _point(engine: Engine, report: ReplayReport, context, previous: TurnPoint | None = None) -> TurnPoint:
    """The state after the step just replayed: three reads (compaction state, archive count,
    summary), or none when ``previous`` is given, whose stored figures still hold."""
    if previous is not None:
        return replace(
            previous,
            turn=report.turns,
            sources={name: r.tokens for name, r in context.sources.items()} if context is not None else None,
            total_tokens=context.total_tokens if context is not None else None,
        )
    state = engine.store.compaction.state(report.session_id)
    summary = engine.store.compaction.summary(report.session_id)
    return TurnPoint(
        turn=report.turns,
        sources={name: r.tokens for name, r in context.sources.items()} if context is not None else None,
        total_tokens=context.total_tokens if context is not None else None,
        reply_reserve=engine.budgets.reply_reserve,
        compactions=state.compactions,
        compaction_failures=state.consecutive_failures,
        archived_segments=engine.store.archive.count(user_id=report.user_id),
        summary_tokens=summary.tokens if summary else 0,
    )


def _track(report: ReplayReport, context) -> None:
    size = context.total_tokens + context.reply_reserve
    report.largest_context = max(report.largest_context, size)
    if context.overflow:
        report.overflows += 1


EVALUATE_THREADS = 2
"""Threads :func:`_evaluate` assembles questions' contexts on. Each assembly is a read that waits
on PostgreSQL for much of its time, so a second thread works while the first waits
(``docs/decisions/measurements.md#evaluation-threads``). The figures do not depend on it: every
question's context is assembled from the same stored state, and the counts are sums."""


def _evaluate(engine: Engine, conv: Conversation, report: ReplayReport) -> None:
    """Evidence recall: the share of evidence turns a question's context holds verbatim.
    The contexts are assembled on :data:`EVALUATE_THREADS` threads and counted in question order."""
    if not conv.qa:
        return
    text_by_id = {t.turn_id: t.text for t in conv.turns if t.turn_id}
    asked: list[tuple[QAItem, list[str]]] = []
    for qa in conv.qa:
        if qa.category not in CATEGORIES:
            continue
        evidence = [text_by_id[e] for e in qa.evidence if e in text_by_id]
        if evidence:
            asked.append((qa, evidence))

    def context_of(item: tuple[QAItem, list[str]]) -> AssembledContext:
        return engine.assemble(user_id=report.user_id, session_id=report.session_id, pending=item[0].question)

    with ThreadPoolExecutor(max_workers=EVALUATE_THREADS, thread_name_prefix="companion-replay-eval") as pool:
        contexts = list(pool.map(context_of, asked))
    for (qa, evidence), context in zip(asked, contexts, strict=True):
        _track(report, context)
        recent = context.source_text.get("recent", "")
        memory = context.source_text.get("memory", "")
        for cat in ("all", CATEGORIES[qa.category]):
            report.evidence_total[cat] = report.evidence_total.get(cat, 0) + len(evidence)
            report.evidence_in_context[cat] = report.evidence_in_context.get(cat, 0) + sum(
                1 for e in evidence if e in recent or e in memory
            )
            report.evidence_retrieval[cat] = report.evidence_retrieval.get(cat, 0) + sum(
                1 for e in evidence if e in memory
            )


def user_turn_coverage(engine: Engine, session_id: str) -> tuple[int, int]:
    """(user turns, those found verbatim in the recent window, the summary or an archived segment)."""
    turns = engine.store.turns.of_session(session_id)
    summary = engine.store.compaction.summary(session_id)
    summary_text = summary.content if summary else ""
    archive = "\n".join(s.content for s in engine.store.archive.segments(session_id=session_id))
    users = [t for t in turns if t.role == "user"]
    found = sum(1 for t in users if t.state == TurnState.context or t.content in summary_text or t.content in archive)
    return len(users), found
