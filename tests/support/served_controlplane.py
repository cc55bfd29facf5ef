"""A control plane served in this process (uvicorn in a thread, its own SQLite), for tests that drive it over HTTP.

Drills record their runs in it and read back, over its API, the routing
events the gateways shipped to it, as an operator would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from common.clock import SystemClock
from controlplane.app import create_app
from controlplane.auth import service as auth_service
from controlplane.auth.roles import Role
from controlplane.config import ControlPlaneSettings
from controlplane.db import build_engine, build_session_factory, session_scope
from controlplane.schema import upgrade
from lifeline.processes import free_port


@dataclass
class ControlPlane:
    url: str
    factory: Any
    tokens: dict[str, str]  # role → bearer token
    server: uvicorn.Server
    thread: threading.Thread
    app: Any

    def headers(self, role: str = "operator") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}


def serve_in_thread(app: Any) -> tuple[str, uvicorn.Server, threading.Thread]:
    """`app` served by uvicorn in a daemon thread on a free port, once it listens: (base url, server, thread)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="controlplane", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "control plane did not start"
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server, thread


@contextmanager
def served_controlplane(workdir: Path, **settings_: Any) -> Iterator[ControlPlane]:
    """The control plane on a free port with a token per role, migrated to head; stopped on exit. `settings_` are
    ControlPlaneSettings fields (an alert routes file, a drivers file)."""
    url = f"sqlite:///{workdir / 'controlplane.sqlite3'}"
    upgrade(url)
    settings = ControlPlaneSettings(database_url=url, data_dir=workdir, artifact_roots=[workdir], **settings_)
    factory = build_session_factory(build_engine(url))
    tokens = {}
    with session_scope(factory) as session:
        for role in Role:
            _, tokens[role.value] = auth_service.create_token(session, name=f"test-{role.value}", role=role,
                                                              created_by="test", clock=SystemClock())
    app = create_app(settings)
    url, server, thread = serve_in_thread(app)
    try:
        yield ControlPlane(url, factory, tokens, server, thread, app)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
