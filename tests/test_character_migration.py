"""Migration 0020: persona names on sessions become characters, and every existing session keeps
working (its archive, knowledge and learned facts with it); the downgrade gives the names back."""

from __future__ import annotations

from alembic import command
from sqlalchemy import text

from memory.database import _alembic_config, head_revision, make_engine
from memory.store import Store
from runtime.config import Settings
from runtime.turn import Engine
from tests.conftest import PERSONA


def _one(conn, sql: str, **params):
    return conn.execute(text(sql), params).fetchall()


def test_persona_names_become_characters_and_old_sessions_keep_working(empty_db_url, embedder):
    engine = make_engine(empty_db_url)
    vector = "[" + ",".join(["0.05"] * 384) + "]"
    with engine.begin() as conn:  # a database of the version before characters, with data
        command.upgrade(_alembic_config(conn, 384), "0019")
        conn.execute(text("INSERT INTO users (id) VALUES ('u1'), ('u2')"))
        conn.execute(
            text(
                "INSERT INTO sessions (id, user_id, persona, created_at, last_activity_at) VALUES "
                "('s-mira', 'u1', 'Mira', now(), now()), ('s-aria', 'u1', 'Aria', now(), now()), "
                "('s-none', 'u2', '', now(), now()), ('s-aria-old', 'u1', 'Aria', now(), now())"
            )
        )
        conn.execute(
            text("INSERT INTO compaction_state (session_id) VALUES ('s-mira'), ('s-aria'), ('s-none'), ('s-aria-old')")
        )
        conn.execute(
            text(
                "INSERT INTO archived_segments (user_id, session_id, first_seq, last_seq, content, tokens, "
                "session_date, embedding, search) VALUES ('u1', 's-aria-old', 1, 2, 'User: I keep bees.', 6, now(), "
                f"'{vector}', to_tsvector('english', 'I keep bees'))"
            )
        )
        conn.execute(
            text(
                "INSERT INTO knowledge_chunks (persona, source, chunk_index, content, tokens, sha256, embedding) "
                f"VALUES ('Aria', 'lore.md', 0, 'The island has two harbours.', 8, 'x', '{vector}')"
            )
        )
        conn.execute(text("""INSERT INTO user_profiles (user_id, learned) VALUES ('u1', '["Works as a nurse."]')"""))
        command.upgrade(_alembic_config(conn, 384), head_revision())

    with engine.connect() as conn:
        characters = {r.name: r.id for r in _one(conn, "SELECT name, id FROM characters WHERE app_id IS NULL")}
        assert set(characters) == {"Mira", "Aria", "Companion"}
        by_session = dict(_one(conn, "SELECT id, character_id FROM sessions"))
        assert by_session == {
            "s-mira": characters["Mira"],
            "s-aria": characters["Aria"],
            "s-none": characters["Companion"],
            "s-aria-old": characters["Aria"],
        }
        assert _one(conn, "SELECT character_id FROM archived_segments") == [(characters["Aria"],)]
        assert _one(conn, "SELECT user_id, character_id, segments FROM archive_counts") == [
            ("u1", characters["Aria"], 1)
        ]
        assert _one(conn, "SELECT character_id FROM knowledge_chunks") == [(characters["Aria"],)]
        learned = {r.character_id: r.facts for r in _one(conn, "SELECT character_id, facts FROM learned_facts")}
        assert learned == {characters["Mira"]: ["Works as a nurse."], characters["Aria"]: ["Works as a nurse."]}

    store = Store(engine)
    runtime = Engine(
        settings=Settings(context_window=4096, database_url="unused"), store=store, embedder=embedder, persona=PERSONA
    )
    for session, user in (("s-mira", "u1"), ("s-aria", "u1"), ("s-none", "u2")):
        result = runtime.turn(user_id=user, session_id=session, message="Hello again", reply="Hi!")
        assert result.assistant_turn.seq == 2
    assert runtime.cast.default.id == characters["Mira"]  # the engine's persona took its name's character
    aria = runtime.assemble(user_id="u1", session_id="s-aria", pending="What do I keep?")
    assert "I keep bees." in aria.source_text["memory"]  # the archive stayed with its character
    mira = runtime.assemble(user_id="u1", session_id="s-mira", pending="What do I keep?")
    assert "I keep bees." not in mira.source_text.get("memory", "")

    with engine.begin() as conn:
        command.downgrade(_alembic_config(conn, 384), "0019")
    with engine.connect() as conn:
        assert dict(_one(conn, "SELECT id, persona FROM sessions")) == {
            "s-mira": "Mira",
            "s-aria": "Aria",
            "s-none": "Companion",
            "s-aria-old": "Aria",
        }
        assert _one(conn, "SELECT persona FROM knowledge_chunks") == [("Aria",)]
        assert _one(conn, "SELECT learned FROM user_profiles WHERE user_id = 'u1'") == [(["Works as a nurse."],)]
    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn, 384), head_revision())
    engine.dispose()
