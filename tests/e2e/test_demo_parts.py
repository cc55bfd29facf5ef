"""Pieces of `lifeline demo` that hold a promise of their own, on real processes.

`QuiescedPause`: the control-plane-down drill records its run in the
control plane's own SQLite database, so the API process must never be
SIGSTOPped inside a write transaction (it would keep SQLite's one write
lock through the outage). A writer process that holds the lock for a
while is paused only after its commit, and the database stays writable
while it is stopped.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from lifeline.demo.cp_outage import QuiescedPause, sqlite_path

WRITER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
while True:
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO t VALUES (?)", (time.time(),))
    print("locked", flush=True)
    time.sleep(0.8)  # a slow write transaction, as a loaded API's can be
    db.execute("COMMIT")
    time.sleep(0.05)  # the gap between two writes, in which the pause takes the lock
"""


class Handle:
    """The drill's PidHandle, by a child's pid."""

    def __init__(self, pid: int) -> None:
        self.pid, self.url, self.token = pid, "http://127.0.0.1:1", "t"

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)


def test_the_api_is_paused_between_writes_and_the_database_stays_writable(tmp_path: Path) -> None:
    database = tmp_path / "cp.sqlite3"
    setup = sqlite3.connect(database)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE t (at REAL)")
    setup.commit()
    setup.close()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(database)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "locked"  # mid-transaction now
        pause = QuiescedPause(Handle(writer.pid), sqlite_path(f"sqlite:///{database}"))
        assert pause.url == "http://127.0.0.1:1" and pause.pid == writer.pid  # the drill reads these through it
        pause.pause()
        assert _stopped(writer.pid)
        other = sqlite3.connect(database, timeout=0, isolation_level=None)  # no busy wait: a held lock raises
        other.execute("BEGIN IMMEDIATE")  # the writer was stopped after its commit: it holds no write lock
        other.execute("INSERT INTO t VALUES (0)")
        other.execute("COMMIT")
        other.close()
        pause.resume()
        assert writer.stdout.readline().strip() == "locked"  # it carries on after SIGCONT
    finally:
        os.kill(writer.pid, signal.SIGCONT)
        writer.kill()
        writer.wait(timeout=10)


def _stopped(pid: int, timeout: float = 2.0) -> bool:
    """SIGSTOP is delivered asynchronously: until /proc shows the process stopped (T)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
            return True
        time.sleep(0.01)
    return False


def test_a_postgresql_url_pauses_at_once() -> None:
    assert sqlite_path("postgresql+psycopg://cp@127.0.0.1/lifeline") is None
    assert sqlite_path("sqlite:////var/lib/lifeline/cp.sqlite3") == Path("/var/lib/lifeline/cp.sqlite3")
