"""Wiring: the parts one engine is made of, built once from its settings and services."""

from __future__ import annotations

from dataclasses import dataclass

from memory.embeddings import Embedder
from memory.files import FileStore
from memory.profiles import Profiles
from memory.store import Store
from persona import Persona
from runtime.accounting import Budgets, TokenCounter
from runtime.compaction import Compactor, Summarizer, summarizer_for
from runtime.config import Settings
from runtime.files import FileServices, ParseService
from runtime.llm import Replier, Transcriber
from runtime.turn._attachments import AttachmentsExtension, FileTool
from runtime.turn._compaction import CompactionScheduler
from runtime.turn._extensions import TurnExtension
from runtime.turn._gather import ContextGatherer
from runtime.turn._images import TurnImages
from runtime.turn._runner import TurnRunner


@dataclass(frozen=True, kw_only=True)
class EngineParts:
    """What :class:`runtime.turn.Engine` delegates to."""

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
    gatherer: ContextGatherer
    runner: TurnRunner


def wire(
    settings: Settings,
    store: Store,
    embedder: Embedder,
    persona: Persona,
    replier: Replier | None,
    summarizer: Summarizer | None,
    counter: TokenCounter,
    file_services: FileServices | None,
    transcriber: Transcriber | None,
    compaction: CompactionScheduler | None = None,
) -> EngineParts:
    """Build an engine's parts: extensions, compactor, context gatherer and turn runner."""
    files = file_services.files if file_services is not None else None
    parses = file_services.parses if file_services is not None else None
    profiles = Profiles(store.engine)
    attachments = AttachmentsExtension(
        store=store,
        parses=parses,
        reader=file_services.reader if file_services is not None else None,
        settings=settings,
        counter=counter,
    )
    images = TurnImages(
        settings=settings,
        store=store,
        files=files,
        counter=counter,
        model=replier.model if replier is not None else settings.model,
        transcriber=transcriber,
    )
    extensions: list[TurnExtension] = [attachments, images]
    compactor = Compactor(
        store=store,
        embedder=embedder,
        summarizer=summarizer or summarizer_for(settings),
        counter=counter,
        keep_exchanges=settings.keep_exchanges,
        target=settings.compaction_target,
        breaker_threshold=settings.breaker_threshold,
        breaker_cooldown=settings.breaker_cooldown,
    )
    budgets, window = settings.scaled_budgets, settings.window
    gatherer = ContextGatherer(
        settings=settings,
        store=store,
        embedder=embedder,
        persona=persona,
        profiles=profiles,
        counter=counter,
        budgets=budgets,
        window=window,
        extensions=extensions,
    )
    runner = TurnRunner(
        settings=settings,
        store=store,
        files=files,
        gatherer=gatherer,
        compactor=compactor,
        profiles=profiles,
        counter=counter,
        replier=replier,
        persona_name=persona.name,
        extensions=extensions,
        scheduler=compaction,
    )
    return EngineParts(
        files=files, parses=parses, counter=counter, budgets=budgets, window=window, profiles=profiles,
        file_tool=attachments.file_tool, images=images, extensions=extensions, compactor=compactor,
        gatherer=gatherer, runner=runner,
    )  # fmt: skip
