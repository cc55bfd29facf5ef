from __future__ import annotations

from alembic import context

from controlplane.config import ControlPlaneSettings
from controlplane.db import DatabaseTimeouts, build_engine
from controlplane.schema import metadata

config = context.config
target_metadata = metadata()


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or ControlPlaneSettings().resolved_database_url()


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = build_engine(_url(), timeouts=DatabaseTimeouts(statement=None))  # DDL may take long
    with engine.connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:
            # SQLite alters a table by rebuilding it (batch move-and-copy), and dropping a table that other rows
            # reference fails while foreign keys are enforced. SQLite's own procedure for it: enforcement off
            # before the transaction (inside one the pragma does nothing), the keys checked before the commit.
            connection.connection.driver_connection.execute("PRAGMA foreign_keys=OFF")
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
            if sqlite and (broken := connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()):
                raise RuntimeError(f"the migration left rows whose foreign keys point nowhere: {broken[:5]}")
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
