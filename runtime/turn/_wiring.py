"""Wiring: the parts one engine is made of, built once from its settings and services.

:class:`EngineParts` builds them (extensions, compactor, context gatherer, turn runner, session
operations) and holds them as attributes; :class:`runtime.turn.Engine` adds the public
operations, which delegate to them.
"""

from __future__ import annotations

from typing import Self

from memory.embeddings import Embedder
from memory.files import FileStore
from memory.profiles import Profiles
from memory.store import Store
from persona import Persona
from runtime.accounting import Budgets, TokenCounter, counter_for
from runtime.compaction import Compactor, Summarizer, summarizer_for
from runtime.config import Settings
from runtime.files import FileServices, ParseService
from runtime.llm import Replier, Reranker, Transcriber, open_reranker
from runtime.turn._attachments import AttachmentsExtension, FileTool
from runtime.turn._backfill import Backfiller, BackfillScheduler, InlineBackfill
from runtime.turn._character_ops import CharacterOps
from runtime.turn._characters import Cast
from runtime.turn._compaction import CompactionScheduler
from runtime.turn._extensions import TurnExtension
from runtime.turn._gather import ContextGatherer
from runtime.turn._images import TurnImages
from runtime.turn._memory_ops import MemoryOps
from runtime.turn._runner import TurnRunner
from runtime.turn._sessions import SessionOps
from runtime.turn._user_ops import UserOps


class EngineParts:
    """What :class:`runtime.turn.Engine` delegates to, wired once from its settings and services.

    Args:
        settings: the engine's settings; ``settings.window`` and ``settings.scaled_budgets`` give
            its context window and per-source caps (tokens).
        replier: the chat model; without one, every turn must carry its ``reply`` (as a replay
            does), else it raises InvalidMessageError (``no_replier``) before storing anything.
        summarizer: by default the one ``COMPANION_SUMMARIZER`` names (:func:`runtime.compaction.summarizer_for`).
        counter: by default the token counter of ``settings.model``.
        file_services: storage, parsing and reading of files; without them attachments are refused.
        transcriber: describes images for a text-only reply model; by default one built from the
            ``COMPANION_VISION_*`` settings.
        compaction: when a session's compaction runs after the reply; by default at once
            (:class:`~runtime.turn.InlineCompaction`).

    Its reranker is the one ``COMPANION_RERANK_MODEL`` names (:func:`runtime.llm.open_reranker`), or
    none; its backfill (where the vectors a down embedder could not make are made later) a thread
    of this process (:class:`~runtime.turn.InlineBackfill`). :meth:`use` sets others.
    """

    settings: Settings
    store: Store
    embedder: Embedder
    persona: Persona
    """The engine's own persona: the deployment's default character (:attr:`cast`'s ``default``)."""
    cast: Cast
    """The characters sessions talk as, each parsed once per revision."""
    replier: Replier | None
    file_services: FileServices | None
    files: FileStore | None
    parses: ParseService | None
    counter: TokenCounter
    budgets: Budgets
    """The per-source caps scaled to ``window`` (tokens)."""
    window: int
    """The model's context window, tokens."""
    profiles: Profiles
    file_tool: FileTool
    images: TurnImages
    extensions: list[TurnExtension]
    """The turn extensions, called in this order (documents, then images)."""
    compactor: Compactor
    backfiller: Backfiller
    """Makes the vectors a down embedder could not make (:mod:`memory.backfill`)."""
    backfill: BackfillScheduler
    """Where :attr:`backfiller` runs when something was stored without its vector."""
    reranker: Reranker | None
    """Reorders recall's best fused candidates (``None``: no rerank stage)."""
    gatherer: ContextGatherer
    runner: TurnRunner
    sessions: SessionOps
    """The greeting and deletions."""
    characters: CharacterOps
    """Stored characters: add, revise, export, delete."""
    users: UserOps
    """A user's data as a whole: erase, export."""
    memories: MemoryOps
    """What characters remember of users: see, search, forget, delete a message."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        embedder: Embedder,
        persona: Persona,
        replier: Replier | None = None,
        summarizer: Summarizer | None = None,
        counter: TokenCounter | None = None,
        file_services: FileServices | None = None,
        transcriber: Transcriber | None = None,
        compaction: CompactionScheduler | None = None,
    ) -> None:
        self.settings, self.store, self.embedder, self.persona = settings, store, embedder, persona
        self.replier, self.file_services = replier, file_services
        self.counter = counter = counter or counter_for(settings.model)
        self.files = files = file_services.files if file_services is not None else None
        self.parses = parses = file_services.parses if file_services is not None else None
        self.profiles = profiles = store.profiles
        attachments = AttachmentsExtension(
            store=store,
            parses=parses,
            reader=file_services.reader if file_services is not None else None,
            settings=settings.files,
            counter=counter,
        )
        self.file_tool = attachments.file_tool
        self.images = TurnImages(
            settings=settings.vision,
            store=store,
            files=files,
            counter=counter,
            model=replier.model if replier is not None else settings.model,
            transcriber=transcriber,
        )
        extensions: list[TurnExtension] = [attachments, self.images]
        self.extensions = extensions
        self.compactor = Compactor(
            store=store,
            embedder=embedder,
            summarizer=summarizer or summarizer_for(settings),
            counter=counter,
            keep_exchanges=settings.keep_exchanges,
            target=settings.compaction_target,
            breaker_threshold=settings.breaker_threshold,
            breaker_cooldown=settings.breaker_cooldown,
        )
        self.backfiller = Backfiller(store=store, embedder=embedder, counter=counter)
        self.budgets, self.window = settings.scaled_budgets, settings.window
        self.cast = Cast(store.characters, persona)
        self.gatherer = ContextGatherer(
            recall=settings.recall,
            turns=settings.turns,
            store=store,
            embedder=embedder,
            cast=self.cast,
            profiles=profiles,
            counter=counter,
            budgets=self.budgets,
            window=self.window,
            extensions=extensions,
        )
        self.runner = TurnRunner(
            settings=settings.turns,
            store=store,
            files=files,
            gatherer=self.gatherer,
            compactor=self.compactor,
            replier=replier,
            extensions=extensions,
            scheduler=compaction,
        )
        self.sessions = SessionOps(runner=self.runner, store=store, files=files, profiles=profiles)
        self.users = UserOps(store=store, files=files, sessions=self.sessions)
        self.memories = MemoryOps(
            store=store,
            files=files,
            runner=self.runner,
            embedder=embedder,
            counter=counter,
            preset=self.gatherer.recall_preset,
        )
        rerank = settings.rerank_model
        self.use(
            reranker=(
                open_reranker(
                    rerank,
                    api_base=settings.rerank_api_base,
                    api_key=settings.rerank_api_key.get_secret_value() if settings.rerank_api_key else None,
                )
                if rerank
                else None
            ),
            backfill=InlineBackfill(self.backfiller),
        )
        self.characters = CharacterOps(
            characters=store.characters,
            cast=self.cast,
            sessions=self.sessions,
            persona_cap=self.budgets.persona,
            counter=counter,
        )

    def derive(self, *, window: int | None = None, persona: Persona | None = None) -> Self:
        """A copy of this engine on the same database and models (replier, summarizer, counter,
        file services, transcriber), with budgets scaled to ``window`` tokens and/or speaking as
        ``persona``."""
        settings = self.settings.model_copy(update={"context_window": window}) if window is not None else self.settings
        return type(self)(
            settings=settings,
            store=self.store,
            embedder=self.embedder,
            persona=persona or self.persona,
            replier=self.replier,
            summarizer=self.compactor.summarizer,
            counter=self.counter,
            file_services=self.file_services,
            transcriber=self.images.transcriber,
            compaction=self.runner.scheduler,
        ).use(reranker=self.reranker, backfill=self.backfill)

    def use(self, *, reranker: Reranker | None, backfill: BackfillScheduler) -> Self:
        """This engine with ``reranker`` as its rerank stage (``None``: none) and ``backfill`` as
        where the vectors a down embedder could not make are made later (the service's queued
        one, a test's); returns it."""
        self.reranker = self.gatherer.reranker = reranker
        self.backfill = self.runner.backfill = backfill
        self.compactor.on_unembedded = backfill.request
        return self
