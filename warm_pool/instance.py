"""One instance the regional agent tracks: a pool instance, an engine it leases for, or one that leases itself.

Shared by the agent (warm_pool/agent.py: probes, canaries, leases) and the
pool reconciler (warm_pool/reconciler.py: pool states), which both change it
on the agent's one loop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from contract.lease import Lease
from contract.sampling import Sampling
from warm_pool.probe import ProbeResult, Verdict
from warm_pool.progress import ProgressTrack
from warm_pool.states import InstanceState

Origin = Literal["registry", "external", "pool"]


@dataclass
class Instance:
    instance_id: str
    url: str
    zone: str
    version: str
    origin: Origin
    first_seen: float
    state: InstanceState | None = None  # pool instances only
    started_at: float | None = None
    health: ProbeResult | None = None
    canary: ProbeResult | None = None
    verdict: Verdict | None = None
    reason: str = ""
    lease: Lease | None = None  # held by the agent
    canaries: int = 0
    canary_task: asyncio.Task | None = None
    unleasable: str | None = None  # why a lease can never route to it (it stamps a generation of its own lease)
    failed_probes: int = 0  # consecutive failed health probes
    boot: tuple[int, float] | None = None  # (boot_generation, started_at) last seen: a change is a restart
    canary_seq: int = 0  # when (Agent._seq) the last canary started
    verdict_since: datetime | None = None  # wall time the verdict last changed
    generation: int | None = None  # of the lease it is routed under (its own, or the agent's), as last seen
    canary_at: datetime | None = None  # wall time the last canary answered
    released_seq: int | None = None  # when the agent last let its lease go: a lease again needs a later canary
    drain_waiting_since: float | None = None  # the version roll waits for its requests since (monotonic)
    in_flight: int | None = None  # running + waiting requests (its /metrics), read while the roll waits on it
    stock_vllm: bool = False  # no /healthz/* (it answered 404): probed on /health, judged by progress too
    progress: ProgressTrack = field(default_factory=ProgressTrack)  # stock vLLM: its /metrics, busy or wedged
    metrics_task: asyncio.Task | None = None  # stock vLLM: a /metrics read that may outlive one probe
    supported: bool = False  # the first-lease check passed (warm_pool/support.py): streams per-token ids
    sampling: Sampling = Sampling.ENGINE_DEFAULT  # what it answered when asked (contract/sampling.py); on its lease
    wrong_outputs: int = 0  # canaries it answered with other tokens than the record

    @property
    def agent_leased(self) -> bool:
        return self.origin == "external" or self.state is InstanceState.SERVING
