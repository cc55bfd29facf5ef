"""Drill request and response shapes, shared by the API, the CLI and the runner."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from controlplane.drill.measure import RTO_LATENCY_MIN_SAMPLES, RTO_LATENCY_WINDOW_S
from controlplane.drill.states import DrillFault, DrillRunState, DrillScope
from controlplane.types import Name, Reason, Text

# Which scope each fault belongs to: an instance fault cannot be declared on a region, and so on.
FAULT_SCOPES: dict[DrillFault, frozenset[DrillScope]] = {
    DrillFault.SIGKILL: frozenset({DrillScope.INSTANCE}),
    DrillFault.SIGSTOP: frozenset({DrillScope.INSTANCE}),
    DrillFault.HANG: frozenset({DrillScope.INSTANCE}),
    DrillFault.CORRUPT_WEIGHTS: frozenset({DrillScope.INSTANCE}),
    DrillFault.BAD_VERSION: frozenset({DrillScope.INSTANCE}),
    DrillFault.ZONE_LOSS: frozenset({DrillScope.ZONE}),
    DrillFault.REGION_LOSS: frozenset({DrillScope.REGION}),
    DrillFault.CONTROLPLANE_DOWN: frozenset({DrillScope.REGION}),
    DrillFault.REDIS_DOWN: frozenset({DrillScope.ZONE, DrillScope.REGION}),
}


class BlastRadius(BaseModel):
    """Everything a drill may touch. The runner refuses any fault target not named here."""

    model_config = ConfigDict(extra="forbid")

    region: Name
    instances: list[Name] = Field(default_factory=list, max_length=1000)
    zones: list[Name] = Field(default_factory=list, max_length=100)
    max_instances: int = Field(1, ge=1, le=1000, description="at most this many instances faulted in one run")

    def allows_instance(self, instance_id: str) -> bool:
        return instance_id in self.instances

    def allows_zone(self, zone: str) -> bool:
        return zone in self.zones


class StopConditions(BaseModel):
    """Bounds on the steady traffic; one crossed aborts the drill and rolls the fault back."""

    model_config = ConfigDict(extra="forbid")

    max_error_rate: float | None = Field(0.5, ge=0.0, le=1.0, description="failed / finished requests")
    ttft_p99_ms: float | None = Field(None, gt=0, description="time to first token, p99 over finished requests")
    min_requests: int = Field(1, ge=1, description="evaluate only once this many requests finished")


class Targets(BaseModel):
    """What the drill checks. Unset means not checked by this drill (and unverified in the SLO document)."""

    model_config = ConfigDict(extra="forbid")

    rto_latency_s: float | None = Field(None, gt=0, description="fault → TTFT p99 back within ttft_target_ms")
    ttft_target_ms: float | None = Field(None, gt=0, description="the TTFT p99 that counts as recovered")
    # RTO_latency's sliding window (controlplane/drill/measure.py): its length, and the fewest samples in it
    # that may say "within target" (fewer is no evidence, so not recovered).
    ttft_window_s: float = Field(RTO_LATENCY_WINDOW_S, gt=0, le=600)
    ttft_window_min_samples: int = Field(RTO_LATENCY_MIN_SAMPLES, ge=1, le=10_000)
    rto_quality_s: float | None = Field(None, gt=0, description="fault → every serving instance answers as the baseline")
    request_rto_s: float | None = Field(None, gt=0, description="largest gap between two tokens at the client")
    token_rpo_tokens: int | None = Field(None, ge=0, description="tokens lost, duplicated or changed")
    rpo_context_tokens: int | None = Field(None, ge=0, description="RPO_context: context tokens the drill's "
                                           "sessions lost (recomputed from their committed prefix) on resume")
    rpo_weight_versions: int | None = Field(None, ge=0, description="how far the standby's weights may lag")


# What a drill session's user says after each answer (turn i + 1 sends follow_ups[i % len]).
FOLLOW_UPS = ("Go on, with the next step.", "What would you measure to be sure?", "And if that fails too?")


class Traffic(BaseModel):
    model_config = ConfigDict(extra="forbid")

    requests: int = Field(8, ge=1, le=10_000)
    concurrency: int = Field(2, ge=1, le=64)
    max_tokens: int = Field(24, ge=1, le=4096)
    prompt: Text = "The standby region takes over when"
    seed: int = 4242
    # Fault after this many tokens reached the client (across all streams).
    fault_after_tokens: int = Field(8, ge=0)
    token_delay_ms: float = Field(0.0, ge=0, description="fault admin slows the victim so the fault lands mid-stream")
    # Outage faults (controlplane_down, redis_down): how long the process stays silent while traffic flows.
    fault_duration_s: float = Field(3.0, gt=0, le=600, description="outage faults: seconds until the drill restores it")
    # Each request a session (`x-session-id`). One turn (the default) carries no context, so it measures
    # no RPO_context; with `session_turns` > 1 each request is a chat conversation of that many turns, each
    # turn's messages holding the previous answers, and the first turn each session finishes after the fault
    # says how much context it re-prefilled (`lifeline.session`): the drill's RPO_context.
    sessions: bool = False
    session_turns: int = Field(1, ge=1, le=32, description="turns per session (requests then counts sessions)")
    # X-Session-Class of each session, in turn (session i takes classes[i % len]); empty: the gateway's default.
    session_classes: list[Name] = Field(default_factory=list, max_length=16)
    # The client's pause between two turns of a session (a person reading the answer); the replication
    # worker copies the last turn's checkpoint meanwhile.
    session_think_s: float = Field(0.0, ge=0, le=600)
    follow_ups: list[Text] = Field(default_factory=lambda: list(FOLLOW_UPS), min_length=1, max_length=32)
    # Client retries: a request that fails is sent again (re-resolving the gateway where the fleet resolves
    # it, e.g. through DNS) until this many seconds after it first started. 0: never (one attempt).
    retry_for_s: float = Field(0.0, ge=0, le=600)
    retry_backoff_s: float = Field(0.2, gt=0, le=10)

    @model_validator(mode="after")
    def _sessions_named(self) -> Traffic:
        if (self.session_turns > 1 or self.session_classes) and not self.sessions:
            raise ValueError("traffic.sessions: session_turns and session_classes need sessions on")
        return self

    @property
    def multi_turn(self) -> bool:
        return self.sessions and self.session_turns > 1


class DrillSpec(BaseModel):
    """POST /api/v1/drills: a new definition, or the next version of an existing name."""

    model_config = ConfigDict(extra="forbid")

    name: Name
    model: Name
    scope: DrillScope
    fault: DrillFault
    blast_radius: BlastRadius
    stop_conditions: StopConditions = Field(default_factory=StopConditions)
    expected_tier: Literal["l7", "mesh", "anycast", "dns"] = "l7"
    targets: Targets = Field(default_factory=Targets)
    traffic: Traffic = Field(default_factory=Traffic)
    description: Text = ""

    @model_validator(mode="after")
    def _consistent(self) -> DrillSpec:
        if self.scope not in FAULT_SCOPES[self.fault]:
            raise ValueError(f"fault {self.fault} is not a {self.scope} fault")
        if self.scope == DrillScope.INSTANCE and not self.blast_radius.instances:
            raise ValueError("blast_radius.instances: an instance drill names the instances it may fault")
        if self.scope == DrillScope.ZONE and not self.blast_radius.zones:
            raise ValueError("blast_radius.zones: a zone drill names the zones it may fault")
        return self


class DrillDefinitionRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    version: int
    model: str
    scope: DrillScope
    fault: DrillFault
    region: str
    blast_radius: dict[str, Any]
    stop_conditions: dict[str, Any]
    expected_tier: str
    targets: dict[str, Any]
    traffic: dict[str, Any]
    description: str
    created_by: str
    created_at: datetime


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int | None = Field(None, ge=1, le=2**31 - 1, description="default: the latest version of the definition")


class AbortRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Reason


class DrillRunRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    definition_id: int
    model: str
    scope: DrillScope
    state: DrillRunState
    revision: int
    trigger: str
    requested_by: str
    approved_by: str | None
    approved_at: datetime | None
    fault_target: str | None
    fault_generation: int | None = None
    abort_reason: str | None
    failure: str | None
    report: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
