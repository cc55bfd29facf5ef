"""Alembic migrations. Run with `lifeline controlplane migrate` (any cwd)."""
