"""What the data plane reports to the control plane: applied snapshots, automatic L7 actions, agents' views.

Gateways and regional agents send these to the control plane over
HTTP, in the background and in batches; never on a request's path. The
control plane stores events in its append-only event log with the same
`routing_tier` label its own cutovers carry, so a post-mortem can tell a
gateway's automatic removal (`actor="gateway:<replica>"`) from an operator's
cutover.

Timestamps are the sender's clock. One sent without a UTC offset is taken
as UTC when it is parsed (`UtcTimestamp`), so everything stored and
answered from a report is timezone-aware on both databases: SQLite keeps
no zone, and a report's JSON columns (its endpoints, instances, staging)
would otherwise echo the naive text back.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from contract.routing_tier import RoutingTier

MAX_BATCH = 500
# Counters and versions the control plane stores land in INTEGER columns, 32-bit on PostgreSQL:
# a larger value must be a 422 at the door, not an overflow (a 500) at the insert.
DB_INT_MAX = 2**31 - 1



def _utc_if_naive(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


UtcTimestamp = Annotated[datetime, AfterValidator(_utc_if_naive)]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataPlaneEvent(_Record):
    """One automatic routing action a data-plane process took on its own."""

    kind: Literal["instance.suppressed", "instance.readmitted", "generation.fenced", "snapshot.refused",
                  # the regional agent: a probe verdict changed; the pool promoted, demoted (a version roll keeps
                  # it warm), started, lost or stopped one
                  "probe.verdict", "pool.promoted", "pool.demoted", "pool.started", "pool.lost", "pool.stopped",
                  # a cold-tier pool's staged artifacts of a version changed outcome (verified, missing, mismatch);
                  # the pool refused to start an engine on a version whose artifacts are missing or mismatch
                  "pool.staging", "pool.start_refused"]
    routing_tier: RoutingTier = RoutingTier.L7
    actor: str = Field(min_length=1, max_length=160, description="gateway:<replica> or agent:<region>")
    region: str = Field(min_length=1, max_length=128)
    instance_id: str | None = Field(None, max_length=200)
    generation: int | None = None
    reason: str = Field(max_length=2000)
    at: UtcTimestamp
    detail: dict[str, str | int | float | bool | None] = Field(default_factory=dict)


class EventBatch(_Record):
    events: list[DataPlaneEvent] = Field(max_length=MAX_BATCH)
    dropped: int = Field(0, ge=0, description="events the sender dropped since its last batch (buffer full)")


class LiveEndpoint(_Record):
    instance_id: str
    generation: int | None
    version: str
    zone: str
    # when a request on this endpoint last finished successfully; the regional agent counts it as a probe
    served_ok_at: UtcTimestamp | None = None


class GatewayReport(_Record):
    """A gateway replica's state as it sees it; `PUT /api/v1/gateways/{replica_id}`."""

    replica_id: str = Field(min_length=1, max_length=160)
    region: str = Field(min_length=1, max_length=128)
    zone: str = Field(max_length=128)
    snapshot_version: int | None = Field(None, ge=0, le=DB_INT_MAX,
                                         description="the snapshot applied; None while routing from static config")
    # Paired with snapshot_version: a version means something only within the epoch it came from.
    snapshot_epoch: str | None = Field(None, max_length=64, description="controlplane_epoch of the applied snapshot")
    snapshot_applied_at: UtcTimestamp | None = None
    routing_source: Literal["static", "snapshot"]
    live_endpoints: list[LiveEndpoint] = Field(default_factory=list, max_length=10_000)
    suppressed: int = Field(0, ge=0, le=DB_INT_MAX)
    ejected: int = Field(0, ge=0, le=DB_INT_MAX)
    reported_at: UtcTimestamp


Verdict = Literal["ok", "timeout", "error", "wrong_output", "overloaded", "draining", "old_generation"]
PoolState = Literal["cold", "warm", "serving", "draining", "gone"]


class AgentInstance(_Record):
    """One instance as the regional agent last saw it: health verdict, pool state, lease, last canary."""

    instance_id: str = Field(min_length=1, max_length=200)
    zone: str = Field(max_length=128)
    version: str = Field(max_length=200)
    url: str = Field(max_length=2000)
    origin: Literal["registry", "external", "pool"] = Field(
        description="registry: renews its own lease; external: the agent leases for it; pool: the agent runs it")
    pool_state: PoolState | None = Field(None, description="pool instances only")
    verdict: Verdict | None = Field(None, description="None until the first probe answered")
    verdict_reason: str = Field("", max_length=2000)
    verdict_since: UtcTimestamp | None = Field(None, description="when the verdict last changed (the agent's clock)")
    lease_held: bool = Field(False, description="the agent holds a lease for it")
    lease_generation: int | None = Field(None, description="the generation it is routed under: the agent's lease, "
                                         "or (origin registry) its own; None: no live lease")
    canary_verdict: Verdict | None = None
    canary_at: UtcTimestamp | None = Field(None, description="when the last canary answered")
    canaries: int = Field(0, ge=0, description="canaries it has answered since the agent first saw it")


StagingOutcome = Literal["verified", "missing", "mismatch"]


class AgentStagedVersion(_Record):
    """A cold-tier pool's version: its staged artifacts as the agent last checked them against the catalog."""

    model: str = Field(max_length=200)
    version: str = Field(max_length=200)
    directory: str = Field(max_length=2000, description="where the pool's driver loads the version from")
    outcome: StagingOutcome = Field(description="verified: every recorded shard present with its sha256; missing: "
                                    "a shard absent; mismatch: a shard's sha256 differs")
    shard: str | None = Field(None, max_length=1000, description="the first missing or differing shard, when known")
    reason: str = Field("", max_length=2000)
    checked_at: UtcTimestamp = Field(description="when the check finished (the agent's clock)")
    held_starts: int = Field(0, ge=0, le=DB_INT_MAX, description="instances the pool wanted to start on this "
                             "version at its last reconcile and refused, the outcome being missing or mismatch: "
                             "the plan is short by that many")


class AgentReport(_Record):
    """A regional agent's view of its region; `PUT /api/v1/agents/{region}`, sent on the agent's loop."""

    region: str = Field(min_length=1, max_length=128)
    agent_id: str = Field(min_length=1, max_length=160, description="one agent process (host:pid or a pod name)")
    sent_at: UtcTimestamp
    snapshot_version: int | None = Field(None, ge=0, le=DB_INT_MAX, description="the snapshot applied; None before "
                                         "the first")
    # Paired with snapshot_version, as in GatewayReport: a version counts only within its epoch.
    snapshot_epoch: str | None = Field(None, max_length=64, description="controlplane_epoch of the applied snapshot")
    instances: list[AgentInstance] = Field(default_factory=list, max_length=10_000)
    staging: list[AgentStagedVersion] | None = Field(
        None, max_length=1000, description="a cold-tier pool's versions and their staging check; None: the agent "
        "runs no cold-tier pool (or predates the check)")
