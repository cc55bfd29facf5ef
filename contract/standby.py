"""The supervisor's side of a standby engine (`python -m engine.standby`): spawn it early, activate it later.

The protocol between a supervisor and its standby process, defined once here
so that every supervisor — the pool's `warm_pool/driver.py` LocalDriver, the
bench, the tests — speaks it without importing the engine (and torch):

    supervisor                         standby process (`python -m engine.standby`)
    ──────────                         ───────────────
    StandbyEngine.spawn() ───────────► imports and warm-up done (and, with a `prime`, the
                                       holder's weights mapped and self-tested): writes the
                                       ready file {"pid", "primed", "prime_error"}, then
                                       blocks on stdin (no CPU)
    activate(serve_args) ──stdin──────► one JSON line {"serve_args": [...]} → `engine serve`
    close() / supervisor dies          EOF on stdin: exit 0, nothing served

Standard library only. Why a standby exists and what it costs: `engine/standby.py`, docs/holder.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

STANDBY_MODULE = "engine.standby"


@dataclass(frozen=True)
class StandbyPrime:
    """What a supervisor knows of the engine a standby will become: enough to map and self-test its weights early.

    Only for a holder-backed engine (`engine serve --holder URL`): the standby
    maps the holder's region read-only and takes no tenancy (engine/standby.py).
    """

    holder_url: str
    model_dir: Path
    dtype: str = "float64"

    def args(self) -> list[str]:
        return ["--prime-holder", self.holder_url, "--prime-model", str(self.model_dir), "--prime-dtype", self.dtype]


@dataclass
class StandbyEngine:
    """The supervisor's handle on one standby process: spawn it early, `activate` it when an engine dies."""

    log_path: Path
    ready_file: Path
    torch_threads: int | None = None
    prime: StandbyPrime | None = None
    popen_kwargs: dict[str, Any] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def spawn(self) -> None:
        self.ready_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", STANDBY_MODULE, "--ready-file", str(self.ready_file)]
        if self.torch_threads:
            cmd += ["--torch-threads", str(self.torch_threads)]
        if self.prime is not None:
            cmd += self.prime.args()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - the child writes to it after activation too
        self.process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
                                        **self.popen_kwargs)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def warm(self) -> bool:
        """Imports and warm-up done: activating now skips the interpreter's start entirely."""
        return self.alive and self.ready_file.exists()

    @property
    def primed(self) -> bool:
        """Warm, and its priming succeeded: the engine it becomes skips re-mapping and the self-test if the
        holder still describes the region it primed."""
        return self.warm and bool(self._readiness().get("primed"))

    def _readiness(self) -> dict[str, Any]:
        try:
            return json.loads(self.ready_file.read_text())
        except (OSError, ValueError):
            return {}

    def activate(self, serve_args: list[str]) -> subprocess.Popen | None:
        """Hand over the `engine serve` arguments; the process, now the engine, or None if the standby is dead.

        A standby still importing is activated all the same: it reads the
        line once its imports finish, which is still sooner than a cold start.
        The handle is spent either way; spawn a new one for the next crash.
        """
        process, self.process = self.process, None
        self.ready_file.unlink(missing_ok=True)
        if process is None or process.poll() is not None or process.stdin is None:
            self._close_log()
            return None
        try:
            process.stdin.write(json.dumps({"serve_args": serve_args}).encode() + b"\n")
            process.stdin.close()
        except (BrokenPipeError, OSError):  # died between poll() and write
            process.wait()
            self._close_log()
            return None
        self._close_log()  # the child holds its own descriptor of the log
        return process

    def close(self) -> None:
        """Retire an unused standby: EOF on its stdin makes it exit without serving."""
        process, self.process = self.process, None
        self.ready_file.unlink(missing_ok=True)
        if process is not None and process.poll() is None and process.stdin is not None:
            try:
                process.stdin.close()
                process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
