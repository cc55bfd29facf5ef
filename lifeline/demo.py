"""`lifeline demo`: the request-recovery promise, end to end, on the embedded default.

It builds the tiny model, registers it in the weight catalog of an embedded
(SQLite) control plane and promotes it to `prod`, starts a gateway with its
in-process lease registry and two engines in two zones, streams a greedy
completion once undisturbed, then streams it again and SIGKILLs the engine
serving it mid-stream. The client's tokens must equal the undisturbed run's
exactly, with contiguous sequence numbers and one migration. Finally the
killed engine restarts and comes back under a higher generation.

Every process is real and is stopped on exit; logs stay in the work dir.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import typer
import yaml
from httpx_sse import connect_sse
from rich.console import Console

from lifeline.processes import free_port, wait_for_http_ok

console = Console(highlight=False)

ALIAS = "tiny"
PROMPT = "The primary region lost power, so the gateway"


@dataclass
class _Process:
    """A `lifeline …` child process with its log file."""

    name: str
    args: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen | None = None

    def start(self) -> _Process:
        log = open(self.log_path, "ab")
        self.popen = subprocess.Popen([sys.executable, "-m", "lifeline.cli", *self.args],
                                      stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env})
        log.close()
        return self

    def wait_http(self, url: str, timeout: float = 120.0) -> None:
        wait_for_http_ok(url, self.popen, name=self.name, log_path=self.log_path, timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def _run_cli(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "lifeline.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"lifeline {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


@dataclass
class _StreamRun:
    token_ids: list[int]
    seqs: list[int]
    text: str
    arrivals: list[float]


def _stream(gateway_url: str, *, kill_after: int | None = None, victim: _Process | None = None,
            prefer: str | None = None, max_tokens: int) -> tuple[_StreamRun, float | None]:
    body = {"model": ALIAS, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "return_token_ids": True}
    headers = {"X-Lifeline-Prefer-Instance": prefer} if prefer else {}
    run = _StreamRun([], [], "", [])
    killed_at = None
    with httpx.Client(timeout=120) as client, connect_sse(
        client, "POST", f"{gateway_url}/v1/completions", json=body, headers=headers
    ) as source:
        source.response.raise_for_status()
        for event in source.iter_sse():
            if event.data == "[DONE]":
                break
            chunk = json.loads(event.data)
            if event.event == "error" or "error" in chunk:
                raise RuntimeError(f"stream ended with an error: {chunk}")
            choice = chunk["choices"][0]
            run.token_ids += choice.get("token_ids", [])
            run.text += choice.get("text", "")
            run.seqs.append(chunk["lifeline"]["seq"])
            run.arrivals.append(time.monotonic())
            if kill_after is not None and victim is not None and killed_at is None and len(run.token_ids) >= kill_after:
                victim.stop(signal.SIGKILL)
                killed_at = time.monotonic()
    return run, killed_at


def _metric(url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def demo(
    workdir: Path = typer.Option(Path(".lifeline/demo"), help="Model, database, configs and logs go here"),
    max_tokens: int = typer.Option(64, min=8, max=1024, help="Tokens per stream"),
    kill_after: int = typer.Option(20, min=1, help="SIGKILL the serving engine after this many tokens"),
) -> None:
    """Kill the engine serving a stream mid-flight; the client never notices."""
    from engine.model_build import build_model

    if kill_after >= max_tokens:
        raise typer.BadParameter("must be below --max-tokens", param_hint="--kill-after")
    workdir = workdir.resolve()
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    console.print("[bold]Lifeline demo[/] — embedded default: SQLite control plane, in-process lease "
                  "registry, in-memory token log, two reference engines in two zones")

    model_dir = workdir / "models" / "tiny-seed0"
    if not (model_dir / "model.safetensors.index.json").exists():
        with console.status("building the tiny model …"):
            build_model(model_dir, preset_name="tiny", seed=0)
    console.print(f"[1/6] model     tiny-seed0 in {model_dir}")

    cp_env = {"LIFELINE_CONTROLPLANE_DATA_DIR": str(workdir), "LIFELINE_CONTROLPLANE_DATABASE_URL": f"sqlite:///{workdir / 'controlplane.sqlite3'}"}
    _run_cli(["controlplane", "migrate"], cp_env)
    versions = json.loads(_run_cli(["catalog", "list", "--json"], cp_env) or "[]")
    if not any(v.get("version") == model_dir.name for v in versions):
        _run_cli(["catalog", "register", ALIAS, model_dir.name, str(model_dir)], cp_env)
        _run_cli(["catalog", "promote", ALIAS, "prod", model_dir.name, "--reason", "demo"], cp_env)
    shown = json.loads(_run_cli(["catalog", "show", ALIAS, model_dir.name], cp_env))
    console.print(f"[2/6] catalog   {ALIAS}/{model_dir.name}: {len(shown['shards'])} files hashed (sha256), "
                  f"semantic fingerprint {shown['fingerprint'][:16]}…, alias prod → {model_dir.name}")

    lease_token = secrets.token_urlsafe(16)
    gateway_port = free_port()
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    config = {
        "replica_id": "demo-gateway",
        "models": [{"alias": ALIAS, "version": model_dir.name, "model_dir": str(model_dir)}],
        "registry": {"kind": "memory", "token": lease_token, "ttl": 2.0, "state_dir": str(workdir / "gateway-state")},
        "recovery": {"stall_timeout": 2.0},
    }
    config_path = workdir / "gateway.yaml"
    config_path.write_text(yaml.safe_dump(config))

    with ExitStack() as stack:
        gateway = _Process("gateway", ["gateway", "serve", "--config", str(config_path), "--port", str(gateway_port)],
                           workdir / "logs" / "gateway.log").start()
        stack.callback(gateway.stop)
        gateway.wait_http(f"{gateway_url}/healthz/live")
        engines: dict[str, _Process] = {}
        for instance_id, zone in (("engine-a", "zone-a"), ("engine-b", "zone-b")):
            port = free_port()
            engines[instance_id] = _Process(instance_id, [
                "engine", "serve", "--model", str(model_dir), "--port", str(port), "--instance-id", instance_id,
                "--zone", zone, "--state-dir", str(workdir / "state" / instance_id), "--torch-threads", "1",
                "--registry", gateway_url, "--registry-token", lease_token,
                "--advertise-url", f"http://127.0.0.1:{port}",
            ], workdir / "logs" / f"{instance_id}.log").start()
            stack.callback(engines[instance_id].stop)
        with console.status("waiting for both engines to load, self-test and take a lease …"):
            for instance_id, engine in engines.items():
                engine.wait_http(f"{engine.args[engine.args.index('--advertise-url') + 1]}/healthz/ready")
            _wait_routable(gateway_url, 2)
        leases = _leases(gateway_url, lease_token)
        console.print(f"[3/6] serving   gateway {gateway_url}; leases {leases}")

        reference, _ = _stream(gateway_url, max_tokens=max_tokens, prefer="engine-b")
        console.print(f"[4/6] reference {len(reference.token_ids)} tokens, undisturbed: {reference.text[:60]!r}…")

        migrations_before = _metric(gateway_url, "lifeline_gateway_migrations_total")
        faulted, killed_at = _stream(gateway_url, max_tokens=max_tokens, kill_after=kill_after,
                                     victim=engines["engine-a"], prefer="engine-a")
        migrations = _metric(gateway_url, "lifeline_gateway_migrations_total") - migrations_before
        identical = faulted.token_ids == reference.token_ids
        contiguous = faulted.seqs == list(range(len(faulted.seqs)))
        gap_ms = (faulted.arrivals[kill_after] - killed_at) * 1000 if killed_at and len(faulted.arrivals) > kill_after else float("nan")
        console.print(f"[5/6] fault     SIGKILL engine-a after {kill_after} tokens: the stream went on with "
                      f"{len(faulted.token_ids)} tokens; identical to reference: {_mark(identical)}; "
                      f"seq 0..{len(faulted.seqs) - 1} contiguous: {_mark(contiguous)}; migrations: {migrations:.0f}; "
                      f"recovery gap (kill → next token): {gap_ms:.0f} ms")

        before = leases.get("engine-a", 0)
        engines["engine-a"].start()
        with console.status("restarting engine-a …"):
            after = _wait_generation_above(gateway_url, lease_token, "engine-a", before)
        console.print(f"[6/6] restart   engine-a is back under generation {after} (was {before}); "
                      "frames of the old generation are refused")
        if not (identical and contiguous and migrations == 1):
            console.print(f"[red]the recovery promise was broken; logs in {workdir / 'logs'}[/]")
            raise typer.Exit(1)
        console.print(f"[green]done[/]: the client saw one unbroken, token-identical stream. Logs: {workdir / 'logs'}")


def _mark(ok: bool) -> str:
    return "[green]yes[/]" if ok else "[red]NO[/]"


def _leases(gateway_url: str, token: str) -> dict[str, int]:
    response = httpx.get(f"{gateway_url}/lifeline/v1/leases", headers={"Authorization": f"Bearer {token}"}, timeout=5)
    response.raise_for_status()
    return {lease["instance_id"]: lease["generation"] for lease in response.json()["leases"]}


def _wait_routable(gateway_url: str, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = httpx.get(f"{gateway_url}/healthz/ready", timeout=2).json()
        if ready.get("routable_endpoints", {}).get(ALIAS, 0) >= count:
            return
        time.sleep(0.1)
    raise TimeoutError(f"the gateway never saw {count} routable engines")


def _wait_generation_above(gateway_url: str, token: str, instance_id: str, generation: int, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = _leases(gateway_url, token).get(instance_id, 0)
        if current > generation:
            return current
        time.sleep(0.1)
    raise TimeoutError(f"{instance_id} did not re-register")
