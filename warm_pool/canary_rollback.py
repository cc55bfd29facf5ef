"""A version on a non-prod alias that fails its canary everywhere: the agent asks the catalog to roll the alias back.

A failed canary ejects one instance (the agent releases its lease or the
gateways eject it by the verdict board). That is right for one instance
whose memory went bad; it is not enough for a bad *version*: the next
instance of it fails the same way, and the alias keeps naming it, so the
cohort routed to it keeps being sent to a version with nothing healthy.
The agent tells the two apart by the only evidence it has: when **every**
instance of a version that has answered a canary failed it with
`wrong_output` (at least one), the version is bad. If an alias other than
`prod` points at that version in the agent's snapshot (and prod does not),
the agent posts

    POST /api/v1/catalog/models/{model}/aliases/{alias}/canary-failures
    {version, expected_revision: the alias revision in its snapshot, instances, reason}

and the catalog rolls the alias back one step with its one-call rollback
(weight_catalog/aliases.py: refused for prod, nothing done if the alias
moved since that revision, so two regions reporting one failure move it
once). prod is never asked for: its version is what the warm pools run,
and taking it away is a cutover an operator decides.

`failed_versions` is pure; `CanaryRollbackReporter.send` answers like
`warm_pool.fault.FaultReporter`: `accepted`, `retry` (unreachable, a
timeout, 5xx: sent again next round), `refused` (any other 4xx, e.g. the
alias moved: the agent stops asking for that revision), `disabled`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from contract.snapshot import RoutingSnapshot
from warm_pool.controlplane_post import ControlPlanePoster

PROD = "prod"


@dataclass(frozen=True)
class CanaryOutcome:
    """One instance's last canary, as the agent holds it."""

    instance_id: str
    version: str
    verdict: str  # warm_pool.probe.Verdict value
    reason: str


@dataclass(frozen=True)
class CanaryFailure:
    model: str
    alias: str
    version: str
    revision: int
    instances: tuple[str, ...]
    reason: str

    @property
    def key(self) -> tuple[str, str, int]:
        """One report per alias revision: the alias moving again is a new question."""
        return (self.model, self.alias, self.revision)

    def body(self) -> dict[str, Any]:
        return {"version": self.version, "expected_revision": self.revision, "instances": list(self.instances),
                "reason": self.reason[:2000]}


def failed_versions(snapshot: RoutingSnapshot | None, outcomes: Iterable[CanaryOutcome]) -> list[CanaryFailure]:
    """The non-prod aliases whose version failed its canary on every instance of it that answered one."""
    if snapshot is None:
        return []
    by_version: dict[str, list[CanaryOutcome]] = {}
    for outcome in outcomes:
        by_version.setdefault(outcome.version, []).append(outcome)
    found = []
    for model, entry in sorted(snapshot.models.items()):
        prod = entry.aliases.get(PROD)
        for alias, target in sorted(entry.aliases.items()):
            if alias == PROD or (prod is not None and prod.version == target.version):
                continue
            answered = sorted(by_version.get(target.version, []), key=lambda o: o.instance_id)
            if not answered or any(o.verdict != "wrong_output" for o in answered):
                continue
            found.append(CanaryFailure(model=model, alias=alias, version=target.version, revision=target.revision,
                                       instances=tuple(o.instance_id for o in answered),
                                       reason=f"wrong_output: {answered[0].reason}"))
    return found


class CanaryRollbackReporter(ControlPlanePoster):
    """Posts a failed canary version to the catalog, which rolls its alias back before it answers."""

    def __init__(self, http: Any, base_url: str | None, *, token: str | None = None, timeout_s: float = 10.0) -> None:
        super().__init__(http, base_url, token=token, timeout_s=timeout_s)

    async def send(self, failure: CanaryFailure) -> tuple[str, dict[str, Any] | str | None]:
        """(outcome, the catalog's answer or why not)."""
        return await self.post(f"/api/v1/catalog/models/{failure.model}/aliases/{failure.alias}/canary-failures",
                               failure.body())
