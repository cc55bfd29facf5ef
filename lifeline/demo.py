"""`lifeline demo`: one engine, one streamed completion, on the embedded default.

Grows as components land; today it builds the tiny model, starts an engine
process, streams a completion through it and shows the health endpoints.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import typer


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def demo(
    workdir: Path = typer.Option(Path(".lifeline/demo"), help="Where the demo keeps its model and state"),
) -> None:
    """Build a model, start an engine and stream a completion through it."""
    from engine.model_build import build_model

    model_dir = workdir / "model-tiny"
    if not (model_dir / "config.json").exists():
        typer.echo(f"building tiny model in {model_dir} …")
        build_model(model_dir, preset_name="tiny", seed=0)
    port = _free_port()
    cmd = [sys.executable, "-m", "lifeline.cli", "engine", "serve", "--model", str(model_dir),
           "--port", str(port), "--instance-id", "demo-engine", "--state-dir", str(workdir / "state")]
    log_path = Path(tempfile.gettempdir()) / f"lifeline-demo-engine-{port}.log"
    with open(log_path, "w") as log_file:
        engine = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/healthz/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if engine.poll() is not None:
                raise typer.Exit(f"engine exited early; see {log_path}")
            time.sleep(0.2)
        typer.echo(f"engine ready: {httpx.get(f'{base}/healthz/generation').json()}")
        body = {"model": "model-tiny", "prompt": "The standby region", "max_tokens": 24,
                "temperature": 0, "stream": True, "return_token_ids": True, "ignore_eos": True}
        typer.echo("streaming: ", nl=False)
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    typer.echo(json.loads(line[6:])["choices"][0]["text"], nl=False)
        typer.echo("\ndone.")
    finally:
        engine.terminate()
        engine.wait(timeout=10)
