"""Alembic migrations for companion-runtime (a package so an installed copy can find them)."""
