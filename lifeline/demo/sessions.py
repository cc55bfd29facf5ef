"""A chat session that outlives its region: checkpointed at eu-west, replicated by Celery, continued at us-east.

What the region-loss scenario adds to "service recovery only": a session of
class `chat`, whose replication policy is `critical` (a checkpoint after
every turn, `PUT /api/v1/replication/policies`, carried to the gateways by
the snapshot), takes its turns at eu-west's gateway. eu-west's engines write
each checkpoint to eu-west's KV store (a directory); a real Celery worker and
beat (`lifeline replication worker|beat`, the demo's private Redis as the
broker, the control plane's SQLite as the database) copy it to us-east's.
After the loss, the session's next turn goes to the gateway eu-west's
clients reach now; its answer is compared token by token with the same turn
asked at eu-west before the loss, and its `lifeline.session` figures say
how much of the context us-east re-prefilled: the RPO_context column.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import oneshot_http
from contract.kv_checkpoint import KVCheckpointStore, open_kv_store
from contract.session import SessionStore
from engine.settings import EngineSettings

SESSION_CLASS = "chat"
TURNS = 3  # at the lost region, before the loss
ANSWER_TOKENS = 16
OPENER = "Our primary region is failing over; what must every on-call engineer check first, in order?"
FOLLOW_UPS = ["Go on, with the next step.", "What would you measure to be sure?", "And if that fails too?"]


def kv_store_url(workdir: Path, region: str) -> str:
    """The region's KV checkpoint store: a directory here, as `file://` (Redis or S3 in production)."""
    return f"file://{workdir / 'kv' / region}"


def sessions_dir(workdir: Path, region: str) -> Path:
    """Where the region's gateway replicas keep session records."""
    return workdir / "sessions" / region


# The engines' KV block (their default --kv-block-tokens): a critical session loses at most the last partial one.
KV_BLOCK_TOKENS: int = EngineSettings.model_fields["kv_block_tokens"].default
ENGINE_ARGS = ["--enable-kv-admin", "--kv-checkpoint-every", "1000000"]  # + --kv-checkpoint-store URL: sessions only


@dataclass
class CeleryReplication:
    """`lifeline replication worker` and `beat` for the demo: its Redis as the broker, its SQLite as the database."""

    workdir: Path
    database_url: str
    broker_url: str
    queue: str
    processes: list[subprocess.Popen] = field(default_factory=list)

    def environment(self) -> dict[str, str]:
        return {**os.environ, "LIFELINE_CONTROLPLANE_DATABASE_URL": self.database_url,
                "LIFELINE_CONTROLPLANE_CELERY_BROKER_URL": self.broker_url,
                "LIFELINE_CONTROLPLANE_DATA_DIR": str(self.workdir / "replication"),
                "LIFELINE_REPLICATION_QUEUE": self.queue, "LIFELINE_REPLICATION_SWEEP_EVERY": "PT1S",
                "LIFELINE_REPLICATION_RETRY_BACKOFF": "PT1S", "LIFELINE_REPLICATION_RETRY_BACKOFF_MAX": "PT2S"}

    def start(self, logs: Path) -> str:
        (self.workdir / "replication").mkdir(parents=True, exist_ok=True)
        for role in ("worker", "beat"):
            with (logs / f"replication-{role}.log").open("ab") as log:
                self.processes.append(subprocess.Popen(
                    [sys.executable, "-m", "lifeline.cli", "replication", role], env=self.environment(),
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        return f"Celery worker + beat on {self.broker_url.rsplit('@', 1)[-1]} (queue {self.queue}), sweeping every 1 s"

    def alive(self) -> bool:
        return bool(self.processes) and all(p.poll() is None for p in self.processes)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def policy(workdir: Path, source: str, destination: str) -> dict[str, Any]:
    """The `chat` class's replication policy: critical, from `source`'s store to `destination`'s."""
    return {"model": "tiny", "session_class": SESSION_CLASS, "mode": "critical", "rpo_context_seconds": 30,
            "rpo_context_turns": 0, "source_store": kv_store_url(workdir, source),
            "destination_store": kv_store_url(workdir, destination), "retention_seconds": 3600,
            "reason": f"demo: {SESSION_CLASS} sessions survive the loss of {source}"}


def _messages(answers: list[str]) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": OPENER}]
    for answer, follow_up in zip(answers, FOLLOW_UPS, strict=False):
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": follow_up}]
    return messages


def _turn(url: str, answers: list[str], headers: dict[str, str]) -> dict[str, Any]:
    body = {"model": "tiny", "messages": _messages(answers), "max_tokens": ANSWER_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}
    response = oneshot_http.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    if response.status_code != 200:
        raise RuntimeError(f"a session turn at {url}: {response.status_code} {response.text[:300]}")
    return response.json()


@dataclass
class Session:
    """One `chat` session: TURNS turns at the doomed region, the reference of the next, then the next elsewhere."""

    session_id: str
    answers: list[str] = field(default_factory=list)
    reference: list[int] = field(default_factory=list)

    @property
    def headers(self) -> dict[str, str]:
        return {"X-Session-Id": self.session_id, "X-Session-Class": SESSION_CLASS}

    def converse(self, url: str) -> None:
        for _ in range(TURNS):
            self.answers.append(_turn(url, self.answers, self.headers)["choices"][0]["message"]["content"])
        # The undisturbed next turn, asked outside the session (so nothing is checkpointed or recorded for it).
        self.reference = _turn(url, self.answers, {})["choices"][0]["token_ids"]

    def wait_replicated(self, workdir: Path, source: str, destination: str, timeout: float = 60.0) -> float:
        """Until the checkpoint after the last turn is in `destination`'s store; seconds waited."""
        began = time.monotonic()
        records = SessionStore(open_kv_store(str(sessions_dir(workdir, source))))
        standby = KVCheckpointStore(open_kv_store(kv_store_url(workdir, destination)))
        while time.monotonic() - began < timeout:
            record = records.get("tiny", self.session_id)
            if record is not None and record.checkpointed_turn == TURNS and record.checkpoint_key in standby.manifests():
                return time.monotonic() - began
            time.sleep(0.2)
        raise TimeoutError(f"session {self.session_id}'s checkpoint after turn {TURNS} never reached {destination}'s "
                           f"store within {timeout:.0f} s (see logs/replication-*.log)")

    def continue_at(self, url: str) -> tuple[bool, dict[str, Any]]:
        """The next turn at `url`: (token-identical to the reference, its `lifeline.session` figures)."""
        answer = _turn(url, self.answers, self.headers)
        figures = (answer.get("lifeline") or {}).get("session") or {}
        return answer["choices"][0]["token_ids"] == self.reference, figures
