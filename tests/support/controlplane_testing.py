"""Test support shared by the control-plane and catalog test suites.

Throwaway databases (SQLite files, PostgreSQL databases created and dropped
per session), table cleaning between tests, fixture model artifacts and a
moto S3 server process. Imported only by tests.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

POSTGRES_ADMIN_URL = os.environ.get("LIFELINE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@contextmanager
def throwaway_database(backend: str, workdir: Path) -> Iterator[str]:
    """A fresh, empty database URL on `backend` ("sqlite" or "postgresql"), removed after."""
    if backend == "sqlite":
        path = workdir / f"controlplane-{uuid.uuid4().hex[:8]}.sqlite3"
        yield f"sqlite:///{path}"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return
    import psycopg

    name = f"lifeline_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def clean_tables(engine: Any) -> None:
    """Empty every table and reset the snapshot counter, keeping the schema.

    `events` is append-only in the database (migration 0003: triggers that
    refuse UPDATE and DELETE). On PostgreSQL, TRUNCATE empties it anyway:
    row triggers do not fire on TRUNCATE. SQLite has no TRUNCATE, and its
    `DELETE FROM` fires the trigger, so the cleaner alone lifts the
    triggers around its DELETE and puts back the exact DDL it read from
    `sqlite_master`. Nothing else in the code base may do this.
    """
    from sqlalchemy import text

    from controlplane.schema import metadata

    tables = [t.name for t in reversed(metadata().sorted_tables)]
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            # A session a test left open would block TRUNCATE forever; fail fast instead.
            conn.execute(text("SET LOCAL lock_timeout = '10s'"))
            conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
            conn.execute(text("INSERT INTO snapshot_counter (id, version, epoch) VALUES (1, 0, :epoch)"),
                         {"epoch": str(uuid.uuid4())})  # a cleaned database is a fresh one
        return
    with engine.connect() as conn:
        triggers = dict(
            conn.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'events'")).all()
        )
    try:
        with engine.begin() as conn:
            for name in triggers:
                conn.execute(text(f'DROP TRIGGER "{name}"'))
            for table in tables:
                conn.execute(text(f"DELETE FROM {table}"))
            if _has_sqlite_sequence(conn):
                conn.execute(text("DELETE FROM sqlite_sequence"))
            conn.execute(text("INSERT INTO snapshot_counter (id, version, epoch) VALUES (1, 0, :epoch)"),
                         {"epoch": str(uuid.uuid4())})  # a cleaned database is a fresh one
    finally:
        # Separately, and whatever happened above: pysqlite runs a DROP that
        # comes before any DML outside the transaction, so a failed clean
        # could otherwise leave later tests running without the guard.
        with engine.begin() as conn:
            present = set(conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'trigger'")).scalars())
            for name, sql in triggers.items():
                if name not in present:
                    conn.execute(text(sql))


def _has_sqlite_sequence(conn: Any) -> bool:
    from sqlalchemy import text

    return conn.execute(text("SELECT 1 FROM sqlite_master WHERE name='sqlite_sequence'")).first() is not None


def write_artifact(
    root: Path,
    *,
    shards: int = 3,
    shard_bytes: int = 64 * 1024,
    seed: int = 0,
    vocab: dict[str, int] | None = None,
    chat_template: str = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}",
    generation_config: dict[str, Any] | None = None,
    hidden_size: int = 64,
    indent: int | None = 2,
    key_order_reversed: bool = False,
) -> Path:
    """A small fake model directory: shard files plus the files the fingerprint reads."""
    import random

    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for index in range(shards):
        (root / f"model-{index + 1:05d}-of-{shards:05d}.safetensors").write_bytes(rng.randbytes(shard_bytes))

    def dump(name: str, value: dict[str, Any]) -> None:
        if key_order_reversed:
            value = dict(reversed(list(value.items())))
        (root / name).write_text(json.dumps(value, indent=indent))

    dump("tokenizer.json", {"version": "1.0", "model": {"type": "BPE", "vocab": vocab or {"a": 0, "b": 1, "ab": 2}}})
    dump("tokenizer_config.json", {"chat_template": chat_template, "eos_token": "</s>", "model_max_length": 2048})
    dump("generation_config.json", generation_config or {"do_sample": False, "eos_token_id": 2, "max_new_tokens": 256})
    dump("config.json", {"architectures": ["LlamaForCausalLM"], "hidden_size": hidden_size, "num_hidden_layers": 2,
                         "vocab_size": 4096, "torch_dtype": "float32", "transformers_version": "4.45.0"})
    return root


# Runs a module on SQLite only, through the integration suite's own session-scoped
# `database_url`. A directory must not override that fixture instead: pytest would
# keep the shared session `db_engine` pointing at the override's database for
# every test that runs after it.
ON_SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
