"""The regional agent's settings: YAML or `LIFELINE_AGENT_*` environment, flags on top; durations in seconds."""

from __future__ import annotations

from datetime import timedelta
from ipaddress import IPv4Address
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, IPvAnyAddress, PrivateAttr, ValidationError,
                      model_validator)
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.durations import Seconds
from contract.pool_plan import DrTier, PlanInputs, PlanRecord
from warm_pool.capacity import PlanError, plan_record


class ExternalEngine(BaseModel):
    """An engine whose lease the agent holds (stock vLLM).

    A bare URL is one too. Missing fields come from `/healthz/generation` (the reference engine); stock
    vLLM has none, so for it the served model name (`/v1/models`, the one model it serves) is the version,
    the instance id is the URL's first host label (a StatefulSet pod's name: `engine-vllm-a-0.engine-vllm…`)
    or `host-port` for an address, and the zone is `unknown` unless given (docs/warm_pool.md).
    """

    model_config = ConfigDict(extra="forbid")

    url: str
    instance_id: str | None = None
    version: str | None = None
    zone: str | None = None


def _engines(value: Any) -> Any:
    if isinstance(value, str):
        value = [u for u in value.split(",") if u.strip()]
    if isinstance(value, list):
        return [{"url": v.strip()} if isinstance(v, str) else v for v in value]
    return value


class EngineCommand(BaseModel):
    """`pool.commands.<version>`: how the `local` driver starts one version's engine (stock vLLM, for one).

    `argv` is a template: each argument is formatted with `{model_dir}` (the version's directory),
    `{version}` (the served model name), `{port}`, `{instance_id}`, `{zone}`, `{region}` and `{state_dir}`
    (the instance's directory). `lifeline.vllm.pool_command()` gives vLLM's, the same command line the
    tests and benches run. Without one, a version starts as `lifeline engine serve`.
    """

    model_config = ConfigDict(extra="forbid")

    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict, description="added to the agent's environment")
    unroute_wait: Seconds = Field(timedelta(seconds=2), ge=timedelta(0), description="a graceful stop: between "
                                  "the agent's release of the lease and SIGTERM, so gateways stop routing first")
    stop_timeout: Seconds = Field(timedelta(seconds=40), gt=timedelta(0), description="a graceful stop: SIGTERM "
                                  "to SIGKILL; longer than the engine's own drain (vLLM's --shutdown-timeout)")

    @model_validator(mode="after")
    def _placeholders_known(self) -> EngineCommand:
        known = {"model_dir": "", "version": "", "port": "", "instance_id": "", "zone": "", "region": "",
                 "state_dir": ""}
        for index, arg in enumerate(self.argv):
            try:
                arg.format(**known)
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"argv[{index}] {arg!r}: unknown placeholder {exc}; known: "
                                 f"{', '.join('{' + k + '}' for k in known)}") from None
        return self

    def render(self, **values: str) -> list[str]:
        return [arg.format(**values) for arg in self.argv]


class ZoneTarget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    serving: int = Field(ge=0)
    warm: int = Field(ge=0)
    warm_previous: int = Field(0, ge=0, description="warm on the previous version, beyond zone loss: a rollback "
                               "promotes them (the plan's warm_previous)")


class KubernetesPoolConfig(BaseModel):
    """`pool.kubernetes`: the kubernetes driver's settings (warm_pool/kubernetes_driver.py) and its way in.

    The way in is one of `api_url` (a plain URL: `kubectl proxy`, the emulator in tests), `kubeconfig`
    (a file, optionally a `context` of it) or neither: the in-cluster service account, as the agent runs
    in its own Deployment.
    """

    model_config = ConfigDict(extra="forbid")

    image: str = Field(min_length=1)
    namespace: str = "lifeline"
    name_prefix: str = "lifeline"
    port: int = Field(8000, gt=0, lt=65536)
    model_dir: str = Field("/models/{version}", description="a version's weights inside the pod, unless "
                           "pool.versions names a directory")
    command: list[str] = Field(default_factory=lambda: ["lifeline", "engine", "serve"])
    args: list[str] = Field(default_factory=lambda: [
        "--model", "{model_dir}", "--served-model-name", "{version}", "--port", "{port}",
        "--instance-id", "$(POD_NAME)", "--zone", "{zone}", "--region", "{region}"])
    readiness_path: str = "/healthz/ready"  # stock vLLM: /health
    models_claim: str | None = None  # a PersistentVolumeClaim mounted read-only at /models
    resources: dict[str, Any] = Field(default_factory=dict)  # the container's, as Kubernetes spells them
    zone_node_label: str = "topology.kubernetes.io/zone"
    termination_grace: Seconds = timedelta(seconds=30)
    kubernetes_version: str = "1.33.0"
    conflict_retries: int = Field(5, ge=0)
    claim_timeout: Seconds = Field(timedelta(seconds=120), gt=timedelta(0))
    poll_interval: Seconds = Field(timedelta(seconds=0.5), gt=timedelta(0))
    resync_interval: Seconds = Field(timedelta(seconds=1), gt=timedelta(0))
    watch: bool = Field(True, description="watch the region's pods (the agent reads them from the watch); false: "
                        "list them on every refresh and every resync_interval")
    api_url: str | None = Field(None, description="the API server's URL, no credentials (kubectl proxy)")
    kubeconfig: Path | None = Field(None, description="a kubeconfig file; with api_url unset too: in-cluster")
    context: str | None = Field(None, description="a context of `kubeconfig`; its current one when unset")

    @model_validator(mode="after")
    def _one_way_in(self) -> KubernetesPoolConfig:
        if self.api_url and self.kubeconfig:
            raise ValueError("pool.kubernetes: set api_url or kubeconfig, not both")
        if self.context and not self.kubeconfig:
            raise ValueError("pool.kubernetes.context names a context of pool.kubernetes.kubeconfig, which is unset")
        return self


class PoolSettings(BaseModel):
    """The warm pool the agent keeps: per zone the plan's serving and warm counts of one model.

    `driver: local` runs `lifeline engine serve` processes here (`state_dir`, `engine_args`);
    `driver: kubernetes` scales one Deployment per zone × version (`kubernetes:`, its own settings).
    """

    model_config = ConfigDict(extra="forbid")

    driver: Literal["local", "kubernetes"] = "local"
    model: str = Field(description="the snapshot's model name; its alias picks the version")
    alias: str = "prod"
    versions: dict[str, Path] = Field(min_length=1, description="version → model directory: on this machine "
                                      "(local), inside the pod (kubernetes)")
    default_version: str | None = Field(None, description="used until a snapshot names the alias' version")
    zones: dict[str, ZoneTarget] = Field(default_factory=dict, description="per zone serving / warm / warm_previous; "
                                         "or leave it to pool.plan")
    plan: dict[str, Any] | None = Field(None, description="the model's DR tier and capacity inputs, as `lifeline pool "
                                        "plan` takes them (without region): the zones are then the plan's")
    state_dir: Path | None = Field(None, description="local: where instances keep their logs and state")
    commands: dict[str, EngineCommand] = Field(default_factory=dict, description="local: version → the command "
                                               "that starts its engine (stock vLLM); others: `lifeline engine serve`")
    engine_args: list[str] = Field(default_factory=list, description="local: extra `lifeline engine serve` flags")
    standby: bool = Field(False, description="local: keep one pre-warmed engine process per holder-backed instance "
                          "(`--holder` in engine_args), so a restart after a crash skips the interpreter start; "
                          "about 180 MiB each (warm_pool/driver.py)")
    kubernetes: KubernetesPoolConfig | None = Field(None, description="kubernetes: the driver's settings")
    start_timeout: Seconds = Field(timedelta(seconds=180), gt=timedelta(0))
    staging_check_every: Seconds = Field(
        timedelta(minutes=10), gt=timedelta(0), description="tier cold: between checks of each version's staged "
        "artifacts against the catalog's sha256 (warm_pool/staging.py); each check reads every byte")
    old_generation_grace: Seconds = Field(
        timedelta(seconds=30), ge=timedelta(0), description="after a promotion, how long the old version's serving "
        "instances keep their leases (no new sessions; established ones finish) once the new version serves the plan")
    old_generation_drain_timeout: Seconds = Field(
        timedelta(minutes=10), gt=timedelta(0), description="after the grace, how long an instance of another "
        "version the roll retires waits for its running and waiting requests (its engine's /metrics) before it is "
        "retired with them still in flight (a pool.stopped event with drain_cut)")

    @model_validator(mode="after")
    def _default_is_known(self) -> PoolSettings:
        if self.default_version is not None and self.default_version not in self.versions:
            raise ValueError(f"pool.default_version {self.default_version!r} is not in pool.versions")
        if unknown := sorted(set(self.commands) - set(self.versions)):
            raise ValueError(f"pool.commands: {unknown} not in pool.versions")
        return self

    @model_validator(mode="after")
    def _driver_settings(self) -> PoolSettings:
        """Each driver's own settings, and only its: a setting the chosen driver ignores is a mistake."""
        if self.driver == "local":
            if self.state_dir is None:
                raise ValueError("pool.state_dir is required with pool.driver: local")
            if self.kubernetes is not None:
                raise ValueError("pool.kubernetes is set but pool.driver is local")
        else:
            if self.kubernetes is None:
                raise ValueError("pool.driver: kubernetes needs pool.kubernetes (at least its image)")
            stray = [name for name in ("state_dir", "engine_args", "standby", "commands") if getattr(self, name)]
            if stray:
                raise ValueError(f"pool.{stray[0]} is for the local driver; pool.driver is kubernetes")
        return self

    _plan_record: PlanRecord | None = PrivateAttr(None)

    def fallback_version(self) -> str:
        return self.default_version or next(iter(self.versions))

    @property
    def plan_record(self) -> PlanRecord | None:
        """The plan the zones came from (pool.plan), with its arithmetic; None when the zones were given."""
        return self._plan_record

    @property
    def tier(self) -> DrTier | None:
        return self._plan_record.tier if self._plan_record else None

    def apply_plan(self, region: str) -> None:
        """The zones of the plan of `pool.plan` for `region`; ValueError naming the `pool.plan.` key it cannot use."""
        if self.plan is None:
            return
        if "region" in self.plan:
            raise ValueError("pool.plan.region: the plan is the agent's region's; leave region out")
        try:
            inputs = PlanInputs.model_validate({**self.plan, "region": region})
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ValueError(f"pool.plan.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
        try:
            record = plan_record(inputs)
        except PlanError as exc:
            raise ValueError(f"pool.plan.{exc.param}: {exc}" if exc.param else f"pool.plan: {exc}") from None
        self.zones = {z.zone: ZoneTarget(serving=z.serving, warm=z.warm, warm_previous=z.warm_previous)
                      for z in record.zones}
        self._plan_record = record


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LIFELINE_AGENT_", extra="forbid")

    region: str = Field(min_length=1)
    agent_id: str | None = Field(None, max_length=160, description="names this agent in its reports; "
                                 "default host:pid")
    controlplane_url: str | None = Field(None, description="the control plane: snapshot in, events out")
    controlplane_token: str | None = None
    snapshot_cache: Path | None = Field(None, description="the last good snapshot on disk")
    snapshot_poll_interval: Seconds = Field(timedelta(seconds=1), gt=timedelta(0))
    report_interval: Seconds = Field(timedelta(seconds=1), gt=timedelta(0),
                                     description="between reports to PUT /api/v1/agents/{region}")
    registry: str = Field("redis://127.0.0.1:6379/0", description="the region's Redis lease registry")
    registry_prefix: str = "lifeline"
    lease_ttl: Seconds = Field(timedelta(seconds=2), gt=timedelta(0))
    probe_interval: Seconds = Field(timedelta(seconds=0.5), gt=timedelta(0),
                                    description="between health probes (and lease renewals); < lease_ttl")
    probe_timeout: Seconds = Field(timedelta(seconds=2), gt=timedelta(0))
    probe_concurrency: int = Field(32, ge=1, le=1000, description="health probes in flight at once; the rest of a "
                                   "round waits its turn, and its timeout starts when it is sent")
    stall_timeout: Seconds = Field(timedelta(seconds=2), gt=timedelta(0), description="stock vLLM: holding "
                                   "requests with its tokens counters unchanged this long is a wedged engine "
                                   "(timeout), though /health answers; > probe_interval (warm_pool/progress.py)")
    busy_grace: Seconds = Field(timedelta(seconds=10), gt=timedelta(0), description="stock vLLM: a health probe "
                                "that times out is overloaded, not timeout, while a /metrics read this recent "
                                "shows it busy and making progress")
    canary_timeout: Seconds = Field(timedelta(seconds=10), gt=timedelta(0), description="how long a canary (and "
                                    "the first-lease check) may wait for a token before it is a timeout; a late "
                                    "first token within it is overloaded")
    canary_per_instance_per_s: float = Field(0.1, gt=0, description="inference probe budget per instance")
    canary_jitter: float = Field(0.2, ge=0, lt=1)
    canary_served_credit_intervals: float = Field(
        2.0, ge=1, description="served traffic postpones an instance's canary, never past this many intervals "
        "after its last one: a corrupted engine answers 200 too")
    renew_leases_for: Annotated[list[ExternalEngine], BeforeValidator(_engines)] = Field(default_factory=list)
    canary_file: Path | None = Field(None, description="JSON: weight version → contract.canary.CanaryRecord")
    pool: PoolSettings | None = None
    fault_rounds: int = Field(3, ge=2, le=10_000, description="consecutive probe rounds a whole zone (or the "
                              "region) must fail before the agent reports a fault; one round is a blip")
    fault_clear_rounds: int = Field(3, ge=1, le=10_000, description="rounds a faulted zone (region) must not be "
                                    "down before the fault clears; it returns later as a new fault")
    fault_report_timeout: Seconds = Field(timedelta(seconds=120), gt=timedelta(0), description="for the answer "
                                          "of POST /api/v1/cutover-escalations, which runs the cutover first")
    canary_rollback: bool = Field(True, description="post a version a non-prod alias names that failed its canary "
                                  "on every instance that answered one to the catalog, which rolls the alias back")
    port: int = Field(0, ge=0, le=65535, description="Prometheus metrics port; 0 serves none")
    metrics_host: IPvAnyAddress = Field(IPv4Address("127.0.0.1"), description="the address /metrics binds: "
                                        "127.0.0.1 keeps it in the pod or host; 0.0.0.0 lets Prometheus scrape "
                                        "it (deploy/ does, behind a NetworkPolicy)")
    log_level: str = "info"

    @model_validator(mode="after")
    def _pool_layout(self) -> AgentSettings:
        pool = self.pool
        if pool is not None and (pool.plan is not None) == bool(pool.zones):
            raise ValueError("set pool.zones or pool.plan (the plan's inputs: the zones are then the plan's), "
                             "exactly one of them")
        if pool is not None and pool.plan is not None:
            pool.apply_plan(self.region)
        return self

    @model_validator(mode="after")
    def _renew_before_expiry(self) -> AgentSettings:
        if self.probe_interval >= self.lease_ttl:
            raise ValueError(f"probe_interval ({self.probe_interval.total_seconds()} s) must be shorter than "
                             f"lease_ttl ({self.lease_ttl.total_seconds()} s): leases are renewed per probe")
        if self.stall_timeout <= self.probe_interval:
            raise ValueError(f"stall_timeout ({self.stall_timeout.total_seconds()} s) must be longer than "
                             f"probe_interval ({self.probe_interval.total_seconds()} s): a stall is seen across probes")
        return self
