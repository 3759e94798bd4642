"""Characters as data: many per deployment, each app's or one user's, with memory per user and character.

- ``characters``: one row per character. ``app_id`` ``NULL`` is a character of the deployment
  (``COMPANION_PERSONA``'s and the command line's), seen by every app; otherwise the app's.
  ``owner_id`` set makes it that user's own (only that user sees it). ``revision`` is the latest
  revision (0: none yet, a character made from an old session's persona name, which speaks as
  the deployment's default until a card is given). A deployment character's name is unique.
- ``character_revisions``: every revision's card, the Character Card ``data`` object as JSONB,
  and the kind it was read from (``spec``). Editing a character adds one; nothing is rewritten.
- ``character_avatars``: the character's image (not revised), read only for the card's PNG and
  the playground.
- ``sessions.character_id`` replaces ``sessions.persona`` (a name); ``turns.character_revision``
  is the revision the turn was made with.
- ``archived_segments.character_id``: the archive is kept per user and character; recall reads
  one character's rows, or all of the user's under ``COMPANION_MEMORY_SCOPE=user``.
  ``archive_counts`` is counted per user and character.
- ``learned_facts``: facts learned from summaries, per user and character; they leave
  ``user_profiles.learned`` (copied to every character the user has a session with, since every
  character saw them before). The profile a user sets stays shared by every character.
- ``knowledge_chunks.character_id`` replaces ``knowledge_chunks.persona`` (a name).

Every persona name found in ``sessions`` or ``knowledge_chunks`` becomes a deployment character of
that name (an empty name becomes ``Companion``), so every existing session keeps working.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_COUNTED = """
CREATE OR REPLACE FUNCTION companion_archive_counted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO archive_counts AS c (user_id, character_id, segments)
        SELECT user_id, character_id, count(*) FROM added GROUP BY user_id, character_id
        ORDER BY user_id, character_id
        ON CONFLICT (user_id, character_id) DO UPDATE SET segments = c.segments + excluded.segments;
    ELSE
        DELETE FROM archive_counts AS c
        USING (SELECT user_id, character_id, count(*) AS n FROM removed GROUP BY user_id, character_id) AS d
        WHERE c.user_id = d.user_id AND c.character_id = d.character_id AND c.segments <= d.n;
        UPDATE archive_counts AS c SET segments = c.segments - d.n
        FROM (SELECT user_id, character_id, count(*) AS n FROM removed GROUP BY user_id, character_id) AS d
        WHERE c.user_id = d.user_id AND c.character_id = d.character_id;
    END IF;
    RETURN NULL;
END $$
"""


_COUNTED_BY_USER = """
CREATE OR REPLACE FUNCTION companion_archive_counted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO archive_counts AS c (user_id, segments)
        SELECT user_id, count(*) FROM added GROUP BY user_id ORDER BY user_id
        ON CONFLICT (user_id) DO UPDATE SET segments = c.segments + excluded.segments;
    ELSE
        DELETE FROM archive_counts AS c
        USING (SELECT user_id, count(*) AS n FROM removed GROUP BY user_id) AS d
        WHERE c.user_id = d.user_id AND c.segments <= d.n;
        UPDATE archive_counts AS c SET segments = c.segments - d.n
        FROM (SELECT user_id, count(*) AS n FROM removed GROUP BY user_id) AS d
        WHERE c.user_id = d.user_id;
    END IF;
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE characters (
            id varchar(40) PRIMARY KEY,
            app_id varchar(200) REFERENCES apps (id),
            owner_id varchar(200) REFERENCES users (id),
            name varchar(200) NOT NULL,
            revision integer NOT NULL DEFAULT 0,
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now(),
            CHECK (owner_id IS NULL OR app_id IS NOT NULL)
        )
        """
    )
    op.execute("CREATE UNIQUE INDEX uq_characters_deployment_name ON characters (name) WHERE app_id IS NULL")
    op.execute("CREATE INDEX ix_characters_app ON characters (app_id, owner_id, created_at)")
    op.execute(
        """
        CREATE TABLE character_revisions (
            character_id varchar(40) NOT NULL REFERENCES characters (id) ON DELETE CASCADE,
            revision integer NOT NULL,
            spec varchar(20) NOT NULL,
            card jsonb NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (character_id, revision)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE character_avatars (
            character_id varchar(40) PRIMARY KEY REFERENCES characters (id) ON DELETE CASCADE,
            mime varchar(100) NOT NULL,
            image bytea NOT NULL
        )
        """
    )
    # every persona name in use becomes a deployment character
    op.execute(
        """
        INSERT INTO characters (id, name)
        SELECT 'ch_' || replace(gen_random_uuid()::text, '-', ''), n
        FROM (SELECT DISTINCT coalesce(nullif(persona, ''), 'Companion') AS n FROM sessions
              UNION SELECT DISTINCT coalesce(nullif(persona, ''), 'Companion') FROM knowledge_chunks) AS names
        """
    )
    op.add_column("sessions", sa.Column("character_id", sa.String(40), sa.ForeignKey("characters.id")))
    op.execute(
        "UPDATE sessions AS s SET character_id = c.id FROM characters AS c "
        "WHERE c.app_id IS NULL AND c.name = coalesce(nullif(s.persona, ''), 'Companion')"
    )
    op.alter_column("sessions", "character_id", nullable=False)
    op.drop_column("sessions", "persona")
    op.execute("CREATE INDEX ix_sessions_character ON sessions (character_id)")
    op.add_column("turns", sa.Column("character_revision", sa.Integer, nullable=True))

    op.add_column("archived_segments", sa.Column("character_id", sa.String(40), sa.ForeignKey("characters.id")))
    op.execute(
        "UPDATE archived_segments AS a SET character_id = s.character_id FROM sessions AS s WHERE s.id = a.session_id"
    )
    op.alter_column("archived_segments", "character_id", nullable=False)
    op.execute("DROP TRIGGER archive_counts_delete ON archived_segments")
    op.execute("DROP TRIGGER archive_counts_insert ON archived_segments")
    op.execute("DROP TABLE archive_counts")
    op.execute(
        """
        CREATE TABLE archive_counts (
            user_id varchar(200) NOT NULL,
            character_id varchar(40) NOT NULL,
            segments bigint NOT NULL CHECK (segments > 0),
            PRIMARY KEY (user_id, character_id)
        )
        """
    )
    op.execute(
        "INSERT INTO archive_counts (user_id, character_id, segments) "
        "SELECT user_id, character_id, count(*) FROM archived_segments GROUP BY user_id, character_id"
    )
    op.execute(_COUNTED)
    op.execute(
        "CREATE TRIGGER archive_counts_insert AFTER INSERT ON archived_segments "
        "REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION companion_archive_counted()"
    )
    op.execute(
        "CREATE TRIGGER archive_counts_delete AFTER DELETE ON archived_segments "
        "REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION companion_archive_counted()"
    )

    op.execute(
        """
        CREATE TABLE learned_facts (
            user_id varchar(200) NOT NULL REFERENCES users (id),
            character_id varchar(40) NOT NULL REFERENCES characters (id) ON DELETE CASCADE,
            facts jsonb NOT NULL DEFAULT '[]',
            updated_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (user_id, character_id)
        )
        """
    )
    op.execute(
        "INSERT INTO learned_facts (user_id, character_id, facts) "
        "SELECT DISTINCT p.user_id, s.character_id, p.learned FROM user_profiles AS p "
        "JOIN sessions AS s ON s.user_id = p.user_id WHERE jsonb_array_length(p.learned) > 0"
    )
    op.drop_column("user_profiles", "learned")

    op.add_column(
        "knowledge_chunks",
        sa.Column("character_id", sa.String(40), sa.ForeignKey("characters.id", ondelete="CASCADE")),
    )
    op.execute(
        "UPDATE knowledge_chunks AS k SET character_id = c.id FROM characters AS c "
        "WHERE c.app_id IS NULL AND c.name = coalesce(nullif(k.persona, ''), 'Companion')"
    )
    op.alter_column("knowledge_chunks", "character_id", nullable=False)
    op.drop_constraint("uq_knowledge_chunks_position", "knowledge_chunks")
    op.drop_column("knowledge_chunks", "persona")
    op.create_unique_constraint(
        "uq_knowledge_chunks_position", "knowledge_chunks", ["character_id", "source", "chunk_index"]
    )


def downgrade() -> None:
    op.add_column("knowledge_chunks", sa.Column("persona", sa.String(200), nullable=False, server_default=""))
    op.execute("UPDATE knowledge_chunks AS k SET persona = c.name FROM characters AS c WHERE c.id = k.character_id")
    op.drop_constraint("uq_knowledge_chunks_position", "knowledge_chunks")
    op.drop_column("knowledge_chunks", "character_id")
    op.create_unique_constraint("uq_knowledge_chunks_position", "knowledge_chunks", ["persona", "source", "chunk_index"])

    op.add_column("user_profiles", sa.Column("learned", JSONB, nullable=False, server_default="[]"))
    op.execute(
        "UPDATE user_profiles AS p SET learned = f.facts FROM (SELECT DISTINCT ON (user_id) user_id, facts "
        "FROM learned_facts ORDER BY user_id, updated_at DESC) AS f WHERE f.user_id = p.user_id"
    )
    op.execute("DROP TABLE learned_facts")

    op.execute("DROP TRIGGER archive_counts_delete ON archived_segments")
    op.execute("DROP TRIGGER archive_counts_insert ON archived_segments")
    op.execute("DROP TABLE archive_counts")
    op.execute(
        "CREATE TABLE archive_counts (user_id varchar(200) PRIMARY KEY, segments bigint NOT NULL CHECK (segments > 0))"
    )
    op.execute(
        "INSERT INTO archive_counts (user_id, segments) SELECT user_id, count(*) FROM archived_segments GROUP BY user_id"
    )
    op.execute(_COUNTED_BY_USER)
    op.execute(
        "CREATE TRIGGER archive_counts_insert AFTER INSERT ON archived_segments "
        "REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION companion_archive_counted()"
    )
    op.execute(
        "CREATE TRIGGER archive_counts_delete AFTER DELETE ON archived_segments "
        "REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION companion_archive_counted()"
    )
    op.drop_column("archived_segments", "character_id")

    op.drop_column("turns", "character_revision")
    op.add_column("sessions", sa.Column("persona", sa.String(200), nullable=False, server_default=""))
    op.execute("UPDATE sessions AS s SET persona = c.name FROM characters AS c WHERE c.id = s.character_id")
    op.drop_column("sessions", "character_id")
    op.execute("DROP TABLE character_avatars")
    op.execute("DROP TABLE character_revisions")
    op.execute("DROP TABLE characters")
