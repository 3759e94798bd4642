"""Job queue: procrastinate's schema (its jobs, events, workers and periodic-defer tables,
types, functions and triggers), so compaction and other work can run as durable jobs that
any number of workers claim from this database.

The SQL is the one procrastinate ships for its installed version
(``procrastinate.schema.SchemaManager.get_schema()``, ``procrastinate/sql/schema.sql``);
a later procrastinate version that changes the schema ships its own migration scripts
(``SchemaManager.get_migrations_path()``), to be applied by a later revision here.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-30
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # imported here: alembic loads every script to find the head, and this import costs 0.1-0.2 s
    from procrastinate.schema import SchemaManager

    # straight to the driver (no bind-parameter parsing of ':'); '%' doubled as psycopg
    # expects, as procrastinate's own SchemaManager.apply_schema does
    op.get_bind().exec_driver_sql(SchemaManager.get_schema().replace("%", "%%"))


def downgrade() -> None:
    op.execute(
        """
        DO $$
        DECLARE r record;
        BEGIN
            FOR r IN SELECT tablename FROM pg_tables
                     WHERE schemaname = current_schema() AND tablename LIKE 'procrastinate\\_%' LOOP
                EXECUTE format('DROP TABLE IF EXISTS %I CASCADE', r.tablename);
            END LOOP;
            FOR r IN SELECT p.oid::regprocedure AS sig FROM pg_proc p
                     JOIN pg_namespace n ON n.oid = p.pronamespace
                     WHERE n.nspname = current_schema() AND p.proname LIKE 'procrastinate\\_%' LOOP
                EXECUTE format('DROP FUNCTION IF EXISTS %s CASCADE', r.sig);
            END LOOP;
            FOR r IN SELECT t.typname FROM pg_type t
                     JOIN pg_namespace n ON n.oid = t.typnamespace
                     WHERE n.nspname = current_schema() AND t.typname LIKE 'procrastinate\\_%' AND t.typtype IN ('e', 'c') LOOP
                EXECUTE format('DROP TYPE IF EXISTS %I CASCADE', r.typname);
            END LOOP;
        END $$;
        """
    )
