"""Context gathering: read what the next reply needs from storage, convert the rows into the
values :mod:`runtime.context` takes, and assemble. A read: nothing is written.

For one session it reads the recent window (less the oldest exchanges over the ``recent`` cap
that no compaction has rolled out yet: they stay out of view, and the summary block says their
summary is pending), then in one more statement the summary, the archive's size (for recall's
choice of path) and whether the session has files and the persona knowledge
(:meth:`memory.assembly.AssemblyReads.session`: what is absent is not read again). It runs each turn
extension's ``gather``, takes the query's vector for recall and the knowledge base (the newest
user message's stored :class:`~memory.tables.TurnVector`; the message embedded when it has
none, as a pending one; a follow-up's enriched query composed from the vectors of the turns it
joins, :func:`runtime.context.enrichment`), recalls archive segments within the ``memory`` budget
(excluding turns still in view), fires lorebook entries, reads the pinned profile and the
calibration baseline, then calls :func:`runtime.context.assemble_context` and each extension's
``finish``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import structlog

from errors import EmbedderUnavailableError
from memory.archive import USER_LABEL, compose, cosine, key_weights
from memory.assembly import SessionReads
from memory.dates import time_spans
from memory.embeddings import Embedder
from memory.knowledge import KnowledgeHit
from memory.profiles import Profiles
from memory.recall import SESSION_CAP, Exclusion, RecalledSegment, RecallPreset, index_pays, within_budget
from memory.store import Store
from memory.tables import Summary, Turn, UserProfile, utcnow
from memory.vector_model import canonical_name
from persona import Persona
from runtime.accounting import CALIBRATION_WINDOW, Baseline, Budgets, CalibratedCounter, TokenCounter, correction
from runtime.compaction import plan_rollout
from runtime.config import RecallSettings, TurnSettings
from runtime.context import (
    BACKGROUND_MESSAGES,
    DEFAULT_USER_NAME,
    AssembledContext,
    ContextInputs,
    FrozenTail,
    KnowledgeItem,
    PinnedProfile,
    RecalledItem,
    RecentTurn,
    RetrievalItem,
    Scan,
    StableRecall,
    SummaryText,
    assemble_context,
    enrich_query,
    enrichment,
    macro_context,
    match_entries,
    named_speaker,
    retrieval_items,
    topic_background,
    user_zone,
    without_names,
)
from runtime.llm import Reranker, rerank_ranked
from runtime.turn._characters import Cast, SessionCharacter
from runtime.turn._extensions import Gathered, TurnExtension

log = structlog.get_logger("companion.engine")


def pinned(profile: UserProfile | None, learned: Sequence[str] = ()) -> PinnedProfile | None:
    """The context's value for a stored profile row and what the character learned of the user."""
    if profile is None and not learned:
        return None
    return PinnedProfile(
        name=profile.name if profile is not None else None,
        pronouns=profile.pronouns if profile is not None else None,
        facts=tuple(profile.facts or ()) if profile is not None else (),
        learned=tuple(learned),
    )


def user_name(profile: UserProfile | None) -> str:
    """What ``{{user}}`` becomes: the pinned name, else ``User``."""
    return profile.name if profile is not None and profile.name else DEFAULT_USER_NAME


def _summary(row: Summary | None, pending: int) -> SummaryText | None:
    if row is None:
        return SummaryText(content="", pending=pending) if pending else None
    return SummaryText(content=row.content, items=len(row.items or []), pending=pending)


def _knowledge(hit: KnowledgeHit) -> KnowledgeItem:
    return KnowledgeItem(source=hit.source, chunk_index=hit.chunk_index, content=hit.content, distance=hit.distance)


@dataclass(frozen=True, kw_only=True)
class RecallText:
    """What one assembly searches its memory with (:meth:`ContextGatherer.query`)."""

    text: str
    """The newest user message (or the pending one)."""
    vector: list[float] | None = field(repr=False)
    """Its embedding, without the speakers' names; the knowledge base's query. ``None`` while the
    embedder is down (recall then runs on full text and dates, and no knowledge is searched)."""
    recall_text: str
    """Recall's full-text query: the message, enriched for a short follow-up."""
    recall_vector: list[float] | None = field(repr=False)
    """Recall's vector: ``vector``, or a follow-up's composed with the turns it joins; ``None``
    with ``vector``."""
    asked_at: datetime
    """When the message was said (aware), for relative dates."""
    speaker: str | None
    """The label of the speaker the message names, or ``None``."""
    continuity: float | None = None
    """Cosine similarity of ``vector`` to the stored vector of the user's message before it in the
    recent window (-1 to 1); ``None``: no such message, no vectors, or the classic layout."""
    background: float | None = None
    """The similarity ``continuity`` must reach besides the setting's for the message to stay on
    its subject, from the user's messages in view (:func:`runtime.context.topic_background`);
    ``None``: too few of them, no vectors, or the classic layout."""

    def on_subject(self, floor: float) -> bool:
        """True when the message stays on the subject of the user's message before it: its
        ``continuity`` reaches both ``floor`` (the setting, on the embedding model's scale) and
        ``background`` (the conversation's own; unknown: False)."""
        return (
            self.continuity is not None
            and self.background is not None
            and self.continuity >= max(floor, self.background)
        )


def stored_cap(cap: int, factor: float) -> int:
    """A cap in stored tokens (raw estimates: turns', summaries') for a session whose counts are
    scaled by ``factor``: what a compaction leaves then fits the cap as the session counts it."""
    return max(1, int(cap / factor))


def calibration(usage: Sequence[Turn]) -> tuple[float, int, Baseline | None]:
    """The session's correction factor (>= 1.0), the provider's per-request overhead (tokens)
    and the baseline of its last reported request, from the newest turns that carry the
    provider's usage (newest first)."""
    found = correction([(t.usage_prompt_tokens, t.request_estimate_tokens) for t in usage])
    last = usage[0] if usage else None
    baseline = (
        Baseline(
            fingerprint=last.request_fingerprint,
            messages=last.request_messages,
            prompt_tokens=last.usage_prompt_tokens,
        )
        if last is not None and last.request_fingerprint and last.request_messages and last.usage_prompt_tokens
        else None
    )
    return found.factor, found.overhead, baseline


class ContextGatherer:
    """Assembles contexts for one engine's characters, budgets and extensions."""

    def __init__(
        self,
        *,
        recall: RecallSettings,
        turns: TurnSettings,
        store: Store,
        embedder: Embedder,
        cast: Cast,
        profiles: Profiles,
        counter: TokenCounter,
        budgets: Budgets,
        window: int,
        extensions: Sequence[TurnExtension],
    ) -> None:
        self.recall_settings = recall
        self.turn_settings = turns
        self.store = store
        self.embedder = embedder
        self.cast = cast
        self.profiles = profiles
        self.counter = counter
        self.budgets = budgets
        self.window = window
        self.extensions = list(extensions)
        self.reranker: Reranker | None = None
        """Reorders recall's best fused candidates (``None``: the fused order stands); set by the engine."""
        self.recall_preset = RecallPreset(
            limit=recall.candidates, pool=recall.pool, neighbours=recall.neighbours, session_cap=SESSION_CAP
        )
        """The engine's recall settings: :data:`memory.recall.ENGINE_PRESET` at the default settings."""

    def assemble(
        self,
        *,
        user_id: str,
        session_id: str,
        profile: UserProfile | None,
        pending: str | None = None,
        budgets: Budgets | None = None,
        window: int | None = None,
        idle_to_memory: bool = True,
        known: Mapping[int, list[float]] | None = None,
        character: SessionCharacter | None = None,
    ) -> tuple[AssembledContext, list[Turn]]:
        """The context (see :meth:`runtime.turn.Engine.assemble`; ``idle_to_memory`` as in
        :func:`runtime.context.assemble_context`), and the session's recent window as it was read
        (the stored turns in state ``context``, in seq order, before any was hidden): a turn hands
        it to its compaction's check, which then need not read it again.

        Steps: read the window and the session's state, let the extensions gather, build the
        recall query (:meth:`query`), recall (:meth:`recall`), calibrate (:func:`calibration`),
        fire the lorebook and search knowledge (:meth:`retrieval`), assemble.

        ``profile``: the user's profile as the caller read it (``None``: the user has none).
        ``known``: turn id → the stored vector of that turn, already at hand (the turn that
        just embedded and stored its message passes it): not read again (:meth:`vectors`).
        ``character``: who the session talks as, as the turn's claim found it; ``None``: the
        session's character at the revision assembly's read finds."""
        budgets = budgets or self.budgets
        stored, usage = self.store.turns.window(session_id, usage_limit=CALIBRATION_WINDOW, user_id=user_id)
        # turns over the recent cap that no compaction has rolled out yet stay out of view: the
        # same exchanges a compaction would roll out now (it runs after the reply)
        # (in the cache layout, only those a compaction left behind before this message came: a
        # compaction that keeps up rolls them out after the reply, changing the prompt's head once)
        newest = stored[-1:] if stored and pending is None and stored[-1].role == "user" else []
        planned = stored[: len(stored) - len(newest)] if self.turn_settings.layout == "cache" else stored
        factor, overhead, baseline = calibration(usage)
        hidden = plan_rollout(
            planned,
            cap=stored_cap(budgets.recent, factor),
            target=self.turn_settings.compaction_target,
            keep_exchanges=self.turn_settings.keep_exchanges,
        )
        out_of_view = sum(len(g) for g in hidden)
        reads = self.store.assembly.session(session_id, user_id=user_id, scoped=self.recall_settings.per_character)
        character = character or self.cast.at(reads.character_id, reads.revision)
        gathered = Gathered(turns=stored[out_of_view:], files=reads.has_files)
        for extension in self.extensions:
            gathered = extension.gather(gathered, user_id=user_id, session_id=session_id)
        turns = gathered.turns
        zone = user_zone(
            profile.time_zone if profile is not None else None,
            next((t.utc_offset_minutes for t in reversed(stored) if t.utc_offset_minutes is not None), None),
        )
        # when the message was said, on the user's clock: relative dates ("yesterday", "上周六") and the
        # clock macros count from it; a pending message (not stored) is taken as said right after the newest turn
        said = next((t.created_at for t in reversed(turns) if pending is not None or t.role == "user"), None)
        now = _aware(said or (turns[-1].created_at if turns else utcnow())).astimezone(zone)
        switched = reads.vector_model is not None and reads.vector_model != canonical_name(self.embedder.name)
        if switched:  # the stored vectors are another model's now: this process's would rank at random
            log.warning("embedder.model_switched", recorded=reads.vector_model, model=self.embedder.name)
        query = self.query(
            turns,
            pending,
            stored=stored,
            known=known,
            profile=profile,
            asked_at=now,
            persona=character.persona,
            user_id=user_id,
            embed=not switched,
        )
        recalled = (
            self.recall(
                query,
                user_id=user_id,
                session_id=session_id,
                budgets=budgets,
                reads=reads,
                turns=turns,
                character_id=character.id if self.recall_settings.per_character else None,
                factor=factor,
            )
            if query is not None
            else []
        )
        earlier = [t.created_at for t in turns if t.role == "user"]
        if pending is None and earlier:
            earlier = earlier[:-1]  # the current message's own turn
        idle = now - _aware(earlier[-1]) if earlier else None
        retrieval = self.retrieval(
            turns,
            pending,
            query.text if query is not None else None,
            query.vector if query is not None else None,
            profile,
            session_id,
            knowledge=reads.has_knowledge,
            now=now,
            idle=idle,
            character=character,
        )
        context = assemble_context(
            ContextInputs(
                session_id=session_id,
                persona=character.persona,
                summary=_summary(reads.summary, out_of_view),
                candidates=recalled,
                turns=[RecentTurn(seq=t.seq, role=t.role, content=t.content) for t in turns],
                pending=pending,
                baseline=baseline,
                calibration=factor,
                overhead=overhead + gathered.reserved_tokens,
                profile=pinned(profile, reads.learned),
                retrieval=retrieval,
                attachments=gathered.blocks,
                earlier_files=gathered.earlier,
                idle_to_memory=idle_to_memory,
                zone=zone,
                now=now,
                idle=idle,
                layout=self.turn_settings.layout,
                kept_recall=(
                    StableRecall(
                        text=reads.recall_block,
                        segment_ids=reads.recall_segments,
                        anchor=reads.recall_anchor,
                        prefix=reads.recall_prefix,
                        tails=tuple(
                            FrozenTail(anchor=t.anchor, text=t.text, segment_ids=t.segments) for t in reads.recall_tails
                        ),
                    )
                    if reads.recall_block is not None
                    else None
                ),
                tail_share=self.turn_settings.recall_tail_share,
                keep=self.turn_settings.recall_keep,
                same_topic=query is not None and query.on_subject(self.turn_settings.recall_same_topic),
            ),
            budgets=budgets,
            window=window or self.window,
            counter=CalibratedCounter(self.counter, factor),
        )
        for extension in self.extensions:
            context = extension.finish(context, gathered)
        return context, stored

    def query(
        self,
        turns: Sequence[Turn],
        pending: str | None,
        *,
        stored: Sequence[Turn],
        known: Mapping[int, list[float]] | None,
        profile: UserProfile | None,
        asked_at: datetime,
        persona: Persona,
        user_id: str | None = None,
        embed: bool = True,
    ) -> RecallText | None:
        """What recall and the knowledge base search with: the newest user message (or
        ``pending``), its vector, and a follow-up's enriched text and composed vector
        (:func:`runtime.context.enrichment`). ``None`` when there is no message yet. ``asked_at``:
        when the message was said, on the user's clock (aware); ``persona``: who the session talks as;
        ``embed`` ``False``: no vectors (the database records another embedding model). The
        message's similarity to the user's message before it (``continuity``, cache layout only)
        uses that message's stored vector (embedded only when it has none), and how alike the
        user's newest messages in view are anyway (``background``,
        :func:`runtime.context.topic_background`) theirs, read with it in one query."""
        query_turn = None if pending is not None else next((t for t in reversed(turns) if t.role == "user"), None)
        text = pending if pending is not None else (query_turn.content if query_turn is not None else None)
        if not text:
            return None
        last_user = max((i for i, t in enumerate(turns) if t.role == "user"), default=len(turns))
        before = turns if pending is not None else turns[:last_user]
        context_turns = [before[i] for i in enrichment(text, [t.content for t in before])]
        names = self.speaker_names(profile, persona)
        vectorless = RecallText(
            text=text,
            vector=None,
            recall_text=enrich_query(text, [t.content for t in before]),
            recall_vector=None,
            asked_at=asked_at,
            speaker=named_speaker(text, names),
        )
        if not embed:
            return vectorless
        # the user's message before this one: has the conversation moved on from it? (the cache
        # layout's kept recall block stays while it has not; the classic layout does not ask)
        previous = [t for t in reversed(before) if t.role == "user"][:1] if self.turn_settings.layout == "cache" else []
        # and how alike the user's messages in view are anyway: their stored vectors, read in the
        # one query that reads the others this needs (a message stored without one is left out)
        users = (
            [t.id for t in before if t.role == "user" and t.id is not None][-BACKGROUND_MESSAGES:] if previous else []
        )
        at_hand = dict(known or {})
        without: set[int] = set()  # read and found to have no stored vector: embedded, not read again
        if previous:
            wanted = [query_turn, *context_turns, *previous]
            ids = {*users, *(t.id for t in wanted if t is not None and t.id is not None)} - at_hand.keys()
            at_hand.update(self.store.turns.vectors(ids, user_id=user_id))
            without = ids - at_hand.keys()
        try:
            vector, *context_vectors = self.vectors(
                [(query_turn, text), *((t, t.content) for t in [*context_turns, *previous])],
                stored={t.id: t.content for t in stored if t.id is not None and t.id not in without},
                known=at_hand,
                names=names,
                user_id=user_id,
            )
        except EmbedderUnavailableError as exc:
            log.warning("embedder.unavailable", at="recall", model=exc.model, status=exc.status)
            return vectorless
        continuity = cosine(vector, context_vectors.pop()) if previous else None
        recall_vector = (
            compose(
                [*context_vectors, vector],
                key_weights(
                    [self.counter.count_text(t) for t in [*(t.content for t in context_turns), text]],
                    centre=len(context_turns),
                ),
            )
            if context_turns
            else vector
        )
        return replace(
            vectorless,
            vector=vector,
            recall_vector=recall_vector,
            continuity=continuity,
            background=topic_background([at_hand[i] for i in users if i in at_hand]) if previous else None,
        )

    def recall(
        self,
        query: RecallText,
        *,
        user_id: str,
        session_id: str,
        budgets: Budgets,
        reads: SessionReads,
        turns: Sequence[Turn],
        character_id: str | None = None,
        factor: float = 1.0,
    ) -> list[RecalledItem]:
        """The archive segments recalled for ``query``: the engine's preset, the session's turns
        still in view (``turns``) left out, within what ``memory`` may grow to (tokens, in the
        segments' stored counts: a session whose correction ``factor`` is below 1 counts each
        stored token at less, so its budget holds more of them); of ``character_id``'s sessions
        with the user only (``None``: of all the user's)."""
        first_recent = turns[0].seq if turns else None
        # memory may also take what the persona, summary and retrieval leave idle
        budget = stored_cap(budgets.memory + budgets.persona + budgets.summary + budgets.retrieval, min(factor, 1.0))
        segments = self.store.archive.recall(
            self.recall_preset.query(
                user_id=user_id,
                character_id=character_id,
                query_embedding=query.recall_vector,
                query_text=query.recall_text,
                when=time_spans(query.text, now=query.asked_at),
                vector_index=index_pays(reads.archived_segments, reads.archive_rows, self.recall_settings.pool),
                token_budget=budget if self.reranker is None else None,
                exclude=Exclusion(session_id=session_id, from_seq=first_recent) if first_recent is not None else None,
                speaker=query.speaker,
            )
        )
        if self.reranker is not None:
            segments = within_budget(self.reranked(query.text, segments), budget)
        return [RecalledItem(**vars(s)) for s in segments]  # flat values: no deep copy as asdict makes

    def reranked(self, query: str, ranked: Sequence[RecalledSegment]) -> list[RecalledSegment]:
        """``ranked`` (recall's fused order, repeats dropped) with its best
        ``COMPANION_RERANK_CANDIDATES`` in the reranker's order and the rest after them in fused
        order; as it was when the reranker fails or passes ``COMPANION_RERANK_SECONDS``
        (:func:`runtime.llm.rerank_ranked`)."""
        assert self.reranker is not None
        return rerank_ranked(
            self.reranker,
            query,
            ranked,
            candidates=self.recall_settings.rerank_candidates,
            seconds=self.recall_settings.rerank_seconds,
            key=lambda s: s.id,
            text=lambda s: s.content,
        )

    def speaker_names(self, profile: UserProfile | None, persona: Persona) -> dict[str, str]:
        """Name → the label of that speaker's archived lines (:func:`memory.archive.turn_line`), for
        :func:`memory.recall.named_speaker`: the character's name and nickname → its name (the
        compactor labels its lines with the persona's name); the user's pinned display name, if
        any, → ``User``. A name both go by tells neither apart and is left out."""
        names = {persona.name: persona.name, persona.char_name: persona.name}
        if profile is not None and profile.name:
            shared = {n for n in names if n.casefold() == profile.name.casefold()}
            names = {n: label for n, label in names.items() if n not in shared}
            if not shared:
                names[profile.name] = USER_LABEL
        return names

    def vectors(
        self,
        wanted: Sequence[tuple[Turn | None, str]],
        *,
        stored: Mapping[int, str],
        known: Mapping[int, list[float]] | None = None,
        names: Mapping[str, str] | None = None,
        user_id: str | None = None,
    ) -> list[list[float]]:
        """The embedding of each ``(turn, text)``: the turn's stored vector when ``text`` is
        what the turn holds in storage (``stored``: turn id → stored content), else the text
        embedded as the store would hold it (:func:`memory.recall.without_names` for a user's message or a
        pending one, ``turn`` ``None``; an assistant turn's text as it is); the texts to embed
        go to the embedder in one call (none, when all are stored).

        ``known``: turn id → that turn's stored vector, already at hand; the store is read
        only for the stored vectors not in it (not at all when it holds them all). ``names``:
        the speakers' names (:meth:`speaker_names`)."""
        reusable = [t.id for t, text in wanted if t is not None and t.id is not None and stored.get(t.id) == text]
        known = known or {}
        found = {i: known[i] for i in reusable if i in known}
        found.update(self.store.turns.vectors((i for i in reusable if i not in found), user_id=user_id))
        vectors: list[list[float] | None] = [
            found.get(t.id) if t is not None and t.id is not None and t.id in reusable else None for t, text in wanted
        ]
        as_stored = [without_names(text, names or {}) if t is None or t.role == "user" else text for t, text in wanted]
        missing = list(dict.fromkeys(x for x, v in zip(as_stored, vectors, strict=True) if v is None))
        fresh = dict(zip(missing, self.embedder.embed(missing), strict=True)) if missing else {}
        return [v if v is not None else fresh[x] for x, v in zip(as_stored, vectors, strict=True)]

    def retrieval(
        self,
        turns: list[Turn],
        pending: str | None,
        query: str | None,
        vector: list[float] | None,
        profile: UserProfile | None,
        session_id: str = "",
        *,
        knowledge: bool = True,
        now: datetime | None = None,
        idle: timedelta | None = None,
        character: SessionCharacter | None = None,
    ) -> list[RetrievalItem]:
        """Lorebook entries fired by the current message and the turns before it, then the
        character's nearest knowledge chunks (not searched with ``knowledge`` ``False``: the
        character has none). ``character``: the session's (``None``: the engine's default)."""
        character = character or self.cast.default
        persona = character.persona
        book = persona.character_book
        name = user_name(profile)
        char = persona.char_name
        macros = macro_context(persona, user_name=name, session_id=session_id, now=now, idle=idle)
        if not query:  # nothing to match yet (e.g. after the greeting): constant entries only
            return retrieval_items(match_entries(book, ""), [], char=char, user=name, macros=macros)
        if pending is not None:
            previous = [t.content for t in turns]
        else:
            last_user = max((i for i, t in enumerate(turns) if t.role == "user"), default=len(turns))
            previous = [t.content for t in turns[:last_user]]
        depth = (
            book.scan_depth
            if book is not None and book.scan_depth is not None
            else self.recall_settings.lorebook_scan_depth
        )
        fired = match_entries(book, Scan(current=query, previous=previous, depth=depth))
        hits = (
            self.store.knowledge.search(
                character_id=character.id,
                query_embedding=vector,
                limit=self.recall_settings.knowledge_chunks,
            )
            if knowledge and vector is not None and self.recall_settings.knowledge_chunks > 0
            else []
        )
        return retrieval_items(fired, [_knowledge(h) for h in hits], char=char, user=name, macros=macros)


def _aware(at: datetime) -> datetime:
    """``at`` with UTC attached when it carries no time zone (stored times are UTC)."""
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
