"""The last snapshot body built, by its ETag: a change is built once per process, not once per poller.

After a change, every gateway's next poll misses its ETag at about the same
time, and each used to build the whole snapshot (its queries, validation,
JSON): the last of G gateways waited for G builds, and a promote's
propagation grew with the number of gateways (bench/fleet.py). The body of
one (epoch, version) never changes — the version is bumped in the same
transaction as every change to what the snapshot shows
(`controlplane.routing_version`) — so the first poller to miss builds it and
the others are sent the same bytes. Pollers that miss together wait on one
lock for that one build rather than building side by side.
"""

from __future__ import annotations

import threading

from sqlalchemy.orm import Session

from controlplane.snapshot import service


class SnapshotBodyCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._etag: str | None = None
        self._body = b""

    def body(self, session: Session, etag: str) -> tuple[str, bytes]:
        """The snapshot for `etag` (the current one, just read) as (the ETag it carries, its JSON).

        A build may come out newer than `etag` (a change committed between
        the two reads): it is labelled, and kept, under its own.
        """
        with self._lock:
            if self._etag != etag:
                snapshot = service.build_snapshot(session)
                self._etag, self._body = snapshot.etag, snapshot.model_dump_json().encode()
            return self._etag, self._body
