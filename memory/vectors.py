"""Vectors sent to PostgreSQL in pgvector's binary format.

pgvector's SQLAlchemy type (``pgvector.sqlalchemy.Vector``) sends every vector as text: each
of its 384 components printed as a decimal number and parsed back by the server. :class:`Vector` sends the same vector as pgvector's binary input
(``vector_recv``: a 2-byte dimension, 2 bytes unused, then big-endian 4-byte floats), packed
by :class:`pgvector.Vector`.

The stored values are the same either way: ``vector`` holds 4-byte floats, and both paths
round a component to the nearest one (the embedder's components are 4-byte floats already, so
nothing is rounded at all). Measured on replays of LoCoMo conv-26: ``docs/evaluation.md``,
"Vectors in binary, one read of the session's state".

A binary parameter is sent without a type (oid 0), so the server takes the type its context
gives it: ``CAST(:q AS vector)``, or the ``vector`` column an ``INSERT`` writes. Every
connection of :func:`memory.database.make_engine`, or of an engine given to
:class:`memory.store.Store`, can send them (:func:`memory.database.send_binary_vectors`).
"""

from __future__ import annotations

from typing import Any

import pgvector
import pgvector.sqlalchemy
from psycopg.adapt import AdaptersMap, Dumper
from psycopg.pq import Format


class _BinaryVectorDumper(Dumper):
    """Dumps a :class:`pgvector.Vector` as pgvector's binary input, with no type (oid 0)."""

    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        return bytes(obj.to_binary())


def register_binary_vectors(adapters: AdaptersMap) -> None:
    """Let connections that use ``adapters`` (a psycopg connection's ``adapters``) send
    :class:`pgvector.Vector` parameters in binary."""
    adapters.register_dumper(pgvector.Vector, _BinaryVectorDumper)


def _packed(value: Any) -> pgvector.Vector | None:
    if value is None or isinstance(value, pgvector.Vector):
        return value
    return pgvector.Vector(value)  # a list of numbers or a 1-D array; raises ValueError otherwise


class Vector(pgvector.sqlalchemy.Vector):
    """pgvector's ``vector(dim)`` column and parameter type, whose values go to the server in
    binary (:func:`register_binary_vectors` on the connection); values read back are as
    pgvector's type reads them (lists of floats). A bound value is a list of numbers, a 1-D
    numpy array or a :class:`pgvector.Vector`; anything else fails the statement (SQLAlchemy's
    ``StatementError`` around pgvector's ``ValueError``), as with pgvector's type."""

    cache_ok = True

    def bind_processor(self, dialect: Any) -> Any:
        return _packed
