"""Schema, migrations and the embedding-dimension check on the real embedded PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from errors import ConfigurationError, EmbeddingDimensionMismatch, SchemaError
from memory.database import check_dimension, current_revision, head_revision, make_engine, require_schema, upgrade
from runtime.config import Settings
from runtime.service import Database, connect, open_engine


def test_migration_from_empty_database_creates_tables_extension_and_indexes(empty_db_url):
    engine = make_engine(empty_db_url)
    assert current_revision(engine) is None
    with pytest.raises(SchemaError, match="companion db upgrade"):
        require_schema(engine)

    upgrade(engine, embedding_dim=384)

    assert current_revision(engine) == head_revision()
    require_schema(engine)
    with engine.connect() as conn:
        tables = {r[0] for r in conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))}
        assert {"users", "sessions", "turns", "summaries", "archived_segments", "compaction_state"} <= tables
        assert conn.execute(text("SELECT extversion FROM pg_extension WHERE extname = 'vector'")).scalar()
        indexes = {
            r.indexname: r.indexdef
            for r in conn.execute(
                text("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'archived_segments'")
            )
        }
    assert "hnsw" in indexes["ix_archived_segments_embedding_hnsw"]
    # half-precision keys in the index (recall orders by this expression), full precision in the table
    assert "halfvec(384)" in indexes["ix_archived_segments_embedding_hnsw"]
    assert "halfvec_cosine_ops" in indexes["ix_archived_segments_embedding_hnsw"]
    assert "(user_id)" in indexes["ix_archived_segments_user_id"]
    upgrade(engine, embedding_dim=384)  # idempotent
    engine.dispose()


def test_the_revisions_read_without_alembic_are_the_ones_alembic_reads(empty_db_url):
    from alembic.config import Config
    from alembic.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from memory.database import MIGRATIONS_DIR

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    assert head_revision() == ScriptDirectory.from_config(config).get_current_head()
    engine = make_engine(empty_db_url)
    for step in ("empty", "migrated"):
        with engine.connect() as conn:
            assert current_revision(engine) == MigrationContext.configure(conn).get_current_revision(), step
        upgrade(engine, embedding_dim=384)
    engine.dispose()


def test_engine_refuses_to_start_when_table_dimension_differs_from_model(empty_db_url, embedder):
    engine = make_engine(empty_db_url)
    upgrade(engine, embedding_dim=768)
    with pytest.raises(EmbeddingDimensionMismatch) as info:
        open_engine(
            Settings(database_url=empty_db_url),
            embedder=embedder,
            database=Database(empty_db_url, engine, embedded=False),
        )
    message = str(info.value)
    assert "768" in message and "384" in message and "companion db reembed" in message
    assert info.value.table_dim == 768 and info.value.model_dim == 384
    check_dimension(engine, model_dim=768, model_name="other")  # the matching dimension passes
    engine.dispose()


def test_open_engine_on_unmigrated_database_says_to_run_upgrade(empty_db_url, embedder):
    engine = make_engine(empty_db_url)
    with pytest.raises(SchemaError, match="companion db upgrade"):
        open_engine(
            Settings(database_url=empty_db_url),
            embedder=embedder,
            database=Database(empty_db_url, engine, embedded=False),
        )
    engine.dispose()


def test_a_database_url_of_another_database_names_database_url_and_not_the_password():
    with pytest.raises(ConfigurationError) as info:
        connect(Settings(database_url="mysql://app:s3cret@db.example/app"))
    assert info.value.setting == "DATABASE_URL"
    assert str(info.value).startswith("DATABASE_URL: ") and "'mysql'" in str(info.value)
    assert "s3cret" not in str(info.value)


def test_vectors_sent_in_binary_store_what_pgvector_text_stores(db_url):
    """A vector parameter goes to the server in pgvector's binary format and is stored as the
    same 4-byte floats as its decimal text; a value that is not one vector is refused."""
    import random

    import sqlalchemy.exc
    from sqlalchemy import bindparam

    from memory.database import make_engine
    from memory.vectors import Vector

    rng = random.Random(7)
    values = [rng.gauss(0.0, 0.05) for _ in range(384)] + [1e-39, -0.0, 123456.789]
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            same = conn.execute(
                text("SELECT CAST(:v AS vector) = CAST(:t AS vector), vector_dims(CAST(:v AS vector))").bindparams(
                    bindparam("v", values, type_=Vector()), t="[" + ",".join(repr(v) for v in values) + "]"
                )
            ).one()
            assert tuple(same) == (True, len(values))
            with pytest.raises(sqlalchemy.exc.StatementError, match="expected list"):
                conn.execute(text("SELECT CAST(:v AS vector)").bindparams(bindparam("v", [[1.0, 2.0]], type_=Vector())))
    finally:
        engine.dispose()


def test_a_store_on_an_engine_not_made_by_make_engine_sends_vectors_too(db_url, embedder):
    """Vectors go in binary on any engine a Store is given, not only on make_engine's."""
    from sqlalchemy import create_engine

    from memory.store import Store

    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        store = Store(engine)
        store.sessions.ensure(session_id="s1", user_id="u1")
        vector = embedder.embed(["hello"])[0]
        turn = store.turns.add(session_id="s1", role="user", content="hello", tokens=3, vector=vector)
        assert store.turns.vectors([turn.id])[turn.id] == pytest.approx(vector, abs=1e-7)
    finally:
        engine.dispose()
