"""What a zone or region drill reads back from the routing tier that should act, and how it undoes the cutover.

A zone or region loss is cut over by Lifeline itself: the regional agent
reports the fault (warm_pool/fault.py), the control plane runs the
escalation ladder (cutover/escalation.py) and the tier's driver changes the
real thing: BIRD's table through ExaBGP (anycast, per zone), BIND9's record
through RFC 2136 (dns, per region). The drill neither reports the fault nor
starts the cutover; it watches, from outside the blast radius:

    TierObserver   what the tier shows now: the zones whose path BIRD holds
                   (`AnycastObserver`, `birdc show route … all`), or the
                   addresses the DNS server answers (`DnsObserver`, a UDP
                   query straight to the authoritative server, no cache)
    HttpCutovers   the control plane's cutover records for one scope, over
                   its API (operator token): which automatic cutover the
                   fault caused, and its rollback once the drill returns
                   what it took away ("rollback is itself a cutover", with
                   its own events)

`CutoverWatch` ties them together for one fault: it notes the cutovers of
the scope (and inside it) that existed before, records when the tier first showed the
scope taken out (polled at most every `poll_s`), waits (bounded) for the
automatic cutover to end, rolls back each one that completed, and records
when the tier shows the scope back. Every wait is bounded; what did not
happen in time is a follow-up item of the report, never a hang.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from common.clock import Clock
from common.logs import get_logger
from common import oneshot_http

log = get_logger(__name__)

ENDED = frozenset({"completed", "failed", "rolled_back", "aborted"})


class TierObserver(Protocol):
    tier: str

    def out(self) -> bool | None:
        """True: the tier shows the scope taken out; False: in; None: could not read it."""


@dataclass
class AnycastObserver:
    """BIRD's paths to the service prefix: the zone is out when no path has its next hop."""

    reader: Any  # cutover.drivers.anycast.BirdRouteReader
    prefix: str
    next_hops: dict[str, str]  # zone → its speaker's next hop
    zone: str
    tier: str = "anycast"

    def announcing(self) -> list[str]:
        paths, _ = self.reader.paths(self.prefix)
        by_hop = {hop: zone for zone, hop in self.next_hops.items()}
        return sorted(by_hop.get(p.next_hop, p.next_hop) for p in paths)

    def out(self) -> bool | None:
        try:
            return self.zone not in self.announcing()
        except Exception as error:  # noqa: BLE001 - birdc failing is "could not read", reported as such
            log.warning("drill_bird_unreadable", error=repr(error))
            return None


@dataclass
class DnsObserver:
    """The A record as the authoritative server answers it; the region is out when none of its addresses is."""

    server: str
    port: int
    name: str
    region_answer: list[str]  # the addresses the record holds while the region serves
    timeout_s: float = 1.0
    tier: str = "dns"

    def answer(self) -> list[str]:
        import dns.message
        import dns.query

        response = dns.query.udp(dns.message.make_query(self.name, "A"), self.server, port=self.port,
                                 timeout=self.timeout_s)
        return sorted(r.address for rrset in response.answer for r in rrset if hasattr(r, "address"))

    def out(self) -> bool | None:
        try:
            return not set(self.answer()) & set(self.region_answer)
        except Exception as error:  # noqa: BLE001 - a timeout or refusal is "could not read"
            log.warning("drill_dns_unreadable", error=repr(error))
            return None


class HttpCutovers:
    """The control plane's cutover records over its API (`GET /cutovers`, `POST /cutovers/{id}/rollback`)."""

    def __init__(self, controlplane_url: str, token: str, *, timeout_s: float = 60.0) -> None:
        self.url = controlplane_url.rstrip("/") + "/api/v1"
        self.headers = {"Authorization": f"Bearer {token}"}
        self.timeout_s = timeout_s

    def of_scope(self, scope: str) -> list[dict[str, Any]]:
        """Every cutover of exactly this scope (the API filters by prefix: a region's would hold its zones')."""
        response = oneshot_http.get(self.url + "/cutovers", params={"scope": scope, "limit": 1000}, headers=self.headers,
                                    timeout=self.timeout_s)
        response.raise_for_status()
        return [c for c in response.json() if c["scope"] == scope]

    def under(self, scope: str) -> list[dict[str, Any]]:
        """Every cutover of this scope and of the scopes inside it (a region's zones)."""
        response = oneshot_http.get(self.url + "/cutovers", params={"scope": scope, "limit": 1000}, headers=self.headers,
                                    timeout=self.timeout_s)
        response.raise_for_status()
        return [c for c in response.json() if c["scope"] == scope or c["scope"].startswith(scope + "/")]

    def rollback(self, cutover_id: int, reason: str) -> dict[str, Any]:
        response = oneshot_http.post(f"{self.url}/cutovers/{cutover_id}/rollback", json={"reason": reason},
                                     headers=self.headers, timeout=self.timeout_s)
        response.raise_for_status()
        return response.json()


@dataclass
class CutoverWatch:
    """One fault's automatic cutover at one tier: seen at the tier, waited for, rolled back, seen back."""

    scope: str  # "region:eu" or "region:eu/zone:eu-a"
    observer: TierObserver
    cutovers: HttpCutovers
    clock: Clock
    sleep: Callable[[float], None]
    cutover_timeout_s: float = 60.0
    return_timeout_s: float = 30.0
    poll_s: float = 0.1
    known: set[int] = field(default_factory=set)
    out_before: bool | None = None
    out_at: float | None = None  # clock.now() when the tier first showed the scope out
    found: list[dict[str, Any]] = field(default_factory=list)
    rolled_back: list[dict[str, Any]] = field(default_factory=list)
    back_at: float | None = None
    return_started_at: float | None = None
    problems: list[str] = field(default_factory=list)
    inside: list[dict[str, Any]] = field(default_factory=list)  # cutovers of scopes inside this one (its zones)
    inside_rolled_back: list[dict[str, Any]] = field(default_factory=list)
    _next_poll: float = 0.0

    def prepare(self) -> None:
        self.known = {c["id"] for c in self.cutovers.under(self.scope)}
        self.out_before = self.observer.out()

    def tick(self, now: float) -> None:
        if self.out_at is not None or now < self._next_poll:
            return
        self._next_poll = now + self.poll_s
        if self.observer.out():
            self.out_at = self.clock.now()

    def new_cutovers(self) -> list[dict[str, Any]]:
        return [c for c in self.cutovers.of_scope(self.scope) if c["id"] not in self.known]

    def wait_for_cutover(self) -> None:
        """Until every cutover of the scope made since `prepare` has ended (and at least one exists), bounded."""
        deadline = self.clock.now() + self.cutover_timeout_s
        while True:
            found = self.new_cutovers()
            self.tick(self.clock.now())
            if found and all(c["state"] in ENDED for c in found):
                self.found = found
                return
            if self.clock.now() >= deadline:
                self.found = found
                self.problems.append(f"no automatic {self.observer.tier} cutover of {self.scope} ended within "
                                     f"{self.cutover_timeout_s:.0f} s of the fault "
                                     f"({[(c['id'], c['state'], c.get('failure')) for c in found] or 'none made'}; "
                                     "a cutover left planned was held by a safety rule or the ladder)")
                return
            self.sleep(self.poll_s)

    def roll_back(self, reason: str) -> None:
        """Roll back every completed cutover found, then wait (bounded) for the tier to show the scope back."""
        self.return_started_at = self.clock.now()
        for cutover in self.found:
            if cutover["state"] != "completed":
                continue
            try:
                self.rolled_back.append(self.cutovers.rollback(cutover["id"], reason))
            except httpx.HTTPError as error:
                self.problems.append(f"rollback of cutover {cutover['id']} failed: {error!r}"[:500])
        deadline = self.clock.now() + self.return_timeout_s
        while self.clock.now() < deadline:
            if self.observer.out() is False:
                self.back_at = self.clock.now()
                return
            self.sleep(self.poll_s)
        self.problems.append(f"the {self.observer.tier} tier did not show {self.scope} back within "
                             f"{self.return_timeout_s:.0f} s of the rollback")

    def sweep_inside(self, reason: str, *, settle_s: float = 2.0) -> None:
        """Roll back the cutovers of scopes *inside* this one made since `prepare` (a region's zones).

        A region does not come back all at once: while one zone's engines
        are up and another's are not, the agent rightly sees a zone fault
        and the control plane withdraws that zone (anycast) — a cutover the
        fault caused, which returning the region must undo too. Run after
        the region is back; once more after `settle_s`, for a report that
        was in flight when the last engine came up.
        """
        for attempt in range(2):
            if attempt:
                self.sleep(settle_s)
            deadline = self.clock.now() + self.cutover_timeout_s
            while True:
                inside = [c for c in self.cutovers.under(self.scope)
                          if c["scope"] != self.scope and c["id"] not in self.known]
                if all(c["state"] in ENDED for c in inside) or self.clock.now() >= deadline:
                    break
                self.sleep(self.poll_s)
            for cutover in inside:
                self.known.add(cutover["id"])
                self.inside.append(cutover)
                if cutover["state"] == "completed":
                    try:
                        done = self.cutovers.rollback(cutover["id"], reason)
                        self.inside_rolled_back.append(done)
                    except httpx.HTTPError as error:
                        self.problems.append(f"rollback of cutover {cutover['id']} ({cutover['scope']}) failed: "
                                             f"{error!r}"[:500])
                elif cutover["state"] not in ("failed", "rolled_back", "aborted"):
                    self.problems.append(f"cutover {cutover['id']} of {cutover['scope']} made during the fault "
                                         f"never ended ({cutover['state']})")

    def checks(self, *, injected: bool) -> list[str]:
        if not injected:
            return []
        out = list(self.problems)
        if self.out_before:
            out.append(f"the {self.observer.tier} tier already showed {self.scope} out before the fault")
        if self.out_at is None:
            out.append(f"the {self.observer.tier} tier never showed {self.scope} out during the fault")
        tiers = sorted({c["tier"] for c in self.found})
        if self.found and self.observer.tier not in tiers:
            out.append(f"the automatic cutover of {self.scope} acted at {tiers}, not {self.observer.tier}")
        bad = [(c["id"], c["state"]) for c in [*self.rolled_back, *self.inside_rolled_back]
               if c.get("state") != "rolled_back"]
        if bad:
            out.append(f"cutovers not rolled back: {bad}")
        return out

    def measurements(self, fault_at: float, prefix: str) -> dict[str, float | None]:
        return {
            f"{prefix}_out_s": None if self.out_at is None else self.out_at - fault_at,
            f"{prefix}_back_s": None if self.back_at is None or self.return_started_at is None
            else self.back_at - self.return_started_at,
        }

    def details(self) -> dict[str, Any]:
        return {"scope": self.scope, "tier": self.observer.tier,
                "cutovers": [{"id": c["id"], "tier": c["tier"], "mode": c["mode"], "state": c["state"],
                              "planned_by": c.get("planned_by")} for c in self.found],
                "rolled_back": [c["id"] for c in self.rolled_back if c.get("state") == "rolled_back"],
                # Cutovers of scopes inside this one that the fault caused (a zone withdrawn while the region
                # came back unevenly), each rolled back when the region was returned.
                "inside": [{"id": c["id"], "scope": c["scope"], "tier": c["tier"], "mode": c["mode"],
                            "state": c["state"]} for c in self.inside],
                "inside_rolled_back": [c["id"] for c in self.inside_rolled_back
                                       if c.get("state") == "rolled_back"]}
