"""The embedding-model guard: the database records which model made its vectors, and the
runtime refuses to open it with another model, even one of the same dimension."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from alembic import command
from sqlalchemy import text

from errors import EmbeddingDimensionMismatch, EmbeddingModelMismatch
from memory.database import _alembic_config, make_engine, upgrade
from memory.vector_model import RecordedModel, check_model, recorded_model
from runtime.config import Settings
from runtime.service import Database, open_engine


class Renamed:
    """The real embedder under another name (same dimension): a different model to the guard."""

    def __init__(self, inner, name: str) -> None:
        self.inner, self.name, self.dimension = inner, name, inner.dimension

    def embed(self, texts):
        return self.inner.embed(texts)


def _open(url, engine, embedder):
    return open_engine(
        Settings(database_url=url), with_model=False, embedder=embedder, database=Database(url, engine, embedded=False)
    )


def test_first_open_records_the_model_and_another_model_of_the_same_dimension_is_refused(db_url, embedder):
    engine = make_engine(db_url)
    assert recorded_model(engine) is None  # the migration records nothing

    _open(db_url, engine, embedder)
    assert recorded_model(engine) == RecordedModel("all-MiniLM-L6-v2", 384)

    with pytest.raises(EmbeddingModelMismatch) as info:
        _open(db_url, engine, Renamed(embedder, "intfloat/multilingual-e5-small"))
    message = str(info.value)
    assert "all-MiniLM-L6-v2" in message and "intfloat/multilingual-e5-small" in message
    assert "COMPANION_EMBEDDING_MODEL" in message and "companion db reembed" in message
    assert isinstance(info.value, EmbeddingDimensionMismatch)  # one hierarchy: old handlers still catch it
    assert recorded_model(engine) == RecordedModel("all-MiniLM-L6-v2", 384)  # a refused open changes nothing

    _open(db_url, engine, embedder)  # the recorded model still opens, under either of its names
    _open(db_url, engine, Renamed(embedder, "sentence-transformers/all-MiniLM-L6-v2"))
    engine.dispose()


def test_a_database_upgraded_with_vectors_but_no_record_gets_the_configured_model(empty_db_url, embedder):
    engine = make_engine(empty_db_url)
    with engine.begin() as conn:  # a database of the version before the record (0017), holding a vector
        command.upgrade(_alembic_config(conn, 384), "0017")
        conn.execute(text("INSERT INTO users (id, created_at) VALUES ('u', now())"))
        conn.execute(
            text(
                "INSERT INTO sessions (id, user_id, persona, created_at, last_activity_at) "
                "VALUES ('s', 'u', '', now(), now())"
            )
        )
        turn_id = conn.execute(
            text(
                "INSERT INTO turns (session_id, seq, role, content, tokens, interrupted, state, created_at) "
                "VALUES ('s', 1, 'user', 'hello', 3, false, 'context', now()) RETURNING id"
            )
        ).scalar_one()
        conn.execute(
            text("INSERT INTO turn_vectors (turn_id, embedding) VALUES (:t, CAST(:v AS vector))"),
            {"t": turn_id, "v": str(embedder.embed(["hello"])[0])},
        )
    upgrade(engine, embedding_dim=384)
    assert recorded_model(engine) is None  # the upgrade cannot know the model

    _open(empty_db_url, engine, embedder)  # the first open records the configured one
    assert recorded_model(engine) == RecordedModel("all-MiniLM-L6-v2", 384)
    with pytest.raises(EmbeddingModelMismatch):
        check_model(engine, model_name="other-384", model_dim=384)
    engine.dispose()


def test_a_command_on_a_database_of_another_model_is_a_one_line_error(db_url):
    engine = make_engine(db_url)
    check_model(engine, model_name="other-384", model_dim=384)  # the vectors were made by another model
    engine.dispose()
    env = {**os.environ, "DATABASE_URL": db_url}

    result = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "inspect", "s1"], env=env, capture_output=True, text=True, timeout=300
    )

    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "'other-384'" in lines[0] and "'all-MiniLM-L6-v2'" in lines[0] and "companion db reembed" in lines[0]
