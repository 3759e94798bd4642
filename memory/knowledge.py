"""A character's knowledge base: chunks of text with embeddings, in ``knowledge_chunks``.

Every read and write is scoped to one character by id (``WHERE character_id = :p`` in SQL),
so two characters' knowledge never mixes. Adding a file replaces that file's chunks in
the same transaction as the rest of the add; nothing is ever half-written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, bindparam, text

from memory.database import autocommit_engine, storage_errors
from memory.vectors import Vector


@dataclass(frozen=True, kw_only=True)
class NewChunk:
    """A chunk to write."""

    content: str
    tokens: int
    """Estimated tokens of ``content``."""
    embedding: list[float]


@dataclass(frozen=True, kw_only=True)
class KnowledgeHit:
    """A chunk found for a query."""

    id: int
    source: str
    chunk_index: int
    content: str
    tokens: int
    distance: float
    """Cosine distance to the query (0 = same direction)."""


@dataclass(frozen=True, kw_only=True)
class KnowledgeSource:
    """One file in a character's knowledge base."""

    source: str
    chunks: int
    tokens: int
    """Sum of the chunks' tokens."""
    added_at: datetime


_EMBEDDING = Vector()
"""The vector type: a list of floats goes to the server in binary (:class:`memory.vectors.Vector`)."""


def replace_sources(engine: Engine, *, character_id: str, sources: Mapping[str, Sequence[NewChunk]]) -> None:
    """In one transaction: for each source, delete the character's chunks of it and write the new ones."""
    with storage_errors(), engine.begin() as conn:
        for source, chunks in sources.items():
            conn.execute(
                text("DELETE FROM knowledge_chunks WHERE character_id = :p AND source = :s"),
                {"p": character_id, "s": source},
            )
            if chunks:
                conn.execute(
                    text(
                        "INSERT INTO knowledge_chunks (character_id, source, chunk_index, content, tokens, sha256, embedding) "
                        "VALUES (:p, :s, :i, :c, :t, :h, CAST(:e AS vector))"
                    ).bindparams(bindparam("e", type_=_EMBEDDING)),
                    [
                        {
                            "p": character_id,
                            "s": source,
                            "i": i,
                            "c": chunk.content,
                            "t": chunk.tokens,
                            "h": hashlib.sha256(chunk.content.encode("utf-8")).hexdigest(),
                            "e": list(chunk.embedding),
                        }
                        for i, chunk in enumerate(chunks)
                    ],
                )


def remove_source(engine: Engine, *, character_id: str, source: str) -> int:
    """Delete the character's chunks of ``source``; returns how many were deleted."""
    with storage_errors(), engine.begin() as conn:
        result = conn.execute(
            text("DELETE FROM knowledge_chunks WHERE character_id = :p AND source = :s"),
            {"p": character_id, "s": source},
        )
        return int(result.rowcount or 0)


def list_sources(engine: Engine, *, character_id: str) -> list[KnowledgeSource]:
    """The character's files, by name."""
    with storage_errors(), engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT source, count(*) AS chunks, sum(tokens) AS tokens, max(created_at) AS added_at "
                "FROM knowledge_chunks WHERE character_id = :p GROUP BY source ORDER BY source"
            ),
            {"p": character_id},
        ).fetchall()
    return [KnowledgeSource(source=r.source, chunks=r.chunks, tokens=int(r.tokens), added_at=r.added_at) for r in rows]


def search_chunks(
    engine: Engine, *, character_id: str, query_embedding: Sequence[float], limit: int
) -> list[KnowledgeHit]:
    """The character's ``limit`` chunks nearest to the query by cosine distance, nearest first."""
    if limit <= 0:
        return []
    with storage_errors(), autocommit_engine(engine).connect() as conn:  # one statement: no BEGIN/ROLLBACK
        rows = conn.execute(
            text(
                "SELECT id, source, chunk_index, content, tokens, embedding <=> CAST(:q AS vector) AS distance "
                "FROM knowledge_chunks WHERE character_id = :p ORDER BY distance, id LIMIT :n"
            ).bindparams(bindparam("q", type_=_EMBEDDING)),
            {"p": character_id, "q": list(query_embedding), "n": int(limit)},
        ).fetchall()
    return [
        KnowledgeHit(
            id=r.id,
            source=r.source,
            chunk_index=r.chunk_index,
            content=r.content,
            tokens=r.tokens,
            distance=float(r.distance),
        )
        for r in rows
    ]


class Knowledge:
    """The knowledge room: the only writer of ``knowledge_chunks``; every call takes the character."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def replace_sources(self, *, character_id: str, sources: Mapping[str, Sequence[NewChunk]]) -> None:
        """:func:`replace_sources` on this room's database."""
        replace_sources(self._engine, character_id=character_id, sources=sources)

    def remove_source(self, *, character_id: str, source: str) -> int:
        """:func:`remove_source` on this room's database."""
        return remove_source(self._engine, character_id=character_id, source=source)

    def list_sources(self, *, character_id: str) -> list[KnowledgeSource]:
        """:func:`list_sources` on this room's database."""
        return list_sources(self._engine, character_id=character_id)

    def search(self, *, character_id: str, query_embedding: Sequence[float], limit: int) -> list[KnowledgeHit]:
        """:func:`search_chunks` on this room's database."""
        return search_chunks(self._engine, character_id=character_id, query_embedding=query_embedding, limit=limit)
