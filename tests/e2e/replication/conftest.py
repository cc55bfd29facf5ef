"""Real Celery replication processes for the end-to-end tests: `lifeline replication worker` and `… beat`
on RabbitMQ (127.0.0.1:5672), the control plane's database on PostgreSQL, two regions' KV stores.

Each test gets its own Celery queue (`LIFELINE_REPLICATION_QUEUE`), so other workers on the same broker
never take its tasks. S3 is moto's server, an emulator; everything else is the real thing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controlplane.db import build_engine, build_session_factory
from controlplane.schema import upgrade
from lifeline.processes import free_port
from tests.integration.replication.conftest import moto_s3, redis_prefixes, s3_env, store_urls  # noqa: F401
from tests.support.controlplane_testing import clean_tables, throwaway_database

BROKER = os.environ.get("LIFELINE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with throwaway_database("postgresql", tmp_path_factory.mktemp("db")) as url:
        upgrade(url)
        yield url


@pytest.fixture
def session_factory(database_url: str) -> Iterator[Any]:
    engine = build_engine(database_url)
    clean_tables(engine)
    yield build_session_factory(engine)
    engine.dispose()


@dataclass
class CeleryProcess:
    role: str
    process: subprocess.Popen[bytes]
    log_path: Path
    metrics_port: int | None = None

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            self.process.send_signal(sig)
            self.process.wait(timeout=30)


class Replication:
    """Starts `lifeline replication worker|beat` processes sharing one queue, database and environment."""

    def __init__(self, workdir: Path, database_url: str, *, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.queue = f"lifeline-replication-test-{uuid.uuid4().hex[:8]}"
        self.env = {**os.environ, "LIFELINE_CONTROLPLANE_DATABASE_URL": database_url,
                    "LIFELINE_CONTROLPLANE_CELERY_BROKER_URL": BROKER,
                    "LIFELINE_CONTROLPLANE_DATA_DIR": str(workdir), "LIFELINE_REPLICATION_QUEUE": self.queue,
                    "LIFELINE_REPLICATION_SWEEP_EVERY": "PT1S", "LIFELINE_REPLICATION_RETRY_BACKOFF": "PT1S",
                    "LIFELINE_REPLICATION_RETRY_BACKOFF_MAX": "PT1S", **env}
        self.started: list[CeleryProcess] = []

    def start(self, role: str, *extra: str) -> CeleryProcess:
        metrics_port = free_port() if role == "worker" else None
        args = [sys.executable, "-m", "controlplane.replication.cli", role, *extra]  # = `lifeline replication`
        if metrics_port is not None:
            args += ["--metrics-port", str(metrics_port)]
        log_path = self.workdir / f"{role}-{len(self.started)}.log"
        process = subprocess.Popen(args, cwd=ROOT, env=self.env, stdout=log_path.open("wb"),
                                   stderr=subprocess.STDOUT)
        started = CeleryProcess(role, process, log_path, metrics_port)
        self.started.append(started)
        if role == "worker":
            wait_for(lambda: "ready" in started.logs() or not started.alive(), f"{role} ready", timeout=60)
            assert started.alive(), started.logs()[-3000:]
        return started

    def celery(self) -> Any:
        from controlplane.celery_app import create_celery
        from controlplane.config import ControlPlaneSettings
        from controlplane.replication.config import ReplicationSettings

        return create_celery(ControlPlaneSettings(database_url=self.env["LIFELINE_CONTROLPLANE_DATABASE_URL"],
                                                  celery_broker_url=BROKER),
                             replication=ReplicationSettings(queue=self.queue))

    def close(self) -> None:
        for started in self.started:
            started.kill(signal.SIGTERM if started.alive() else signal.SIGKILL)


@pytest.fixture
def replication(tmp_path: Path, database_url: str, session_factory: Any) -> Iterator[Callable[..., Replication]]:
    made: list[Replication] = []

    def make(**env: str) -> Replication:
        made.append(Replication(tmp_path, database_url, env=env))
        return made[-1]

    yield make
    for one in made:
        one.close()


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")
