"""After a promotion: what the pool does with instances of other versions. A pure `decide()`, table-tested.

A pool serves the version its alias names (the desired one). When the alias moves:

    serving, old   keeps its lease while the desired version does not yet serve the plan's count, and for
                   `old_generation_grace` after it does (verdict old_generation: no new sessions, established
                   ones finish); then demoted to warm while its zone's previous-version share is short (it is
                   already loaded: keeping it costs no load), else retired (drained, stopped)
    warm, old      up to the zone's `warm_previous` of the *previous* version stay loaded; every other one
                   (beyond the share, or of any other version) is retired
    cold, old      left to finish loading; judged once warm
    previous share backfilled cold per zone to `warm_previous`, counting what is loading and what will be
                   demoted, so the share is never started twice

A loaded instance the roll retires goes only once it has no running or
waiting request (`Member.in_flight`, read from its engine's /metrics), or
once it has waited for them past `old_generation_drain_timeout`
(`Member.drain_overdue`: retired anyway, named in `cut`). Until then it is
`waiting` and keeps what it has (a serving one its lease: established
sessions finish). An unread count (None: not read yet, or /metrics did not
answer) is not idle: only the deadline retires it then. A demotion waits
for nothing: the process and its streams stay.

So a rollback to the previous version finds that share warm and admitted:
promoting it is a lease (a routing change, an l7 event), not a load, and a
rollback is blue/green without holding 2× capacity (the plan's
`warm_previous`, warm_pool/capacity.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from warm_pool.states import InstanceState

S = InstanceState


@dataclass(frozen=True)
class Member:
    """A pool instance as the roll sees it."""

    instance_id: str
    zone: str
    version: str
    state: InstanceState
    in_flight: int | None = None  # running + waiting requests at its engine, as last read; None: not read
    drain_overdue: bool = False  # has waited for its requests longer than old_generation_drain_timeout


@dataclass(frozen=True)
class RollDecision:
    demote: tuple[str, ...] = ()  # serving → warm, kept as the previous version's share
    retire: tuple[str, ...] = ()  # drained and stopped
    cut: tuple[str, ...] = ()  # of `retire`: retired with requests still in flight (or unread), the deadline passed
    waiting: tuple[str, ...] = ()  # would be retired, waits for its requests to finish
    start_previous: Mapping[str, int] = field(default_factory=dict)  # zone → previous-version instances to start


def decide(members: Iterable[Member], *, desired: str, previous: str | None, previous_share: Mapping[str, int],
           old_serving_may_go: bool) -> RollDecision:
    """`previous_share`: zone → warm_previous; `old_serving_may_go`: the desired version serves the plan's count
    and the grace since has passed."""
    previous = previous if previous != desired else None
    old = sorted((m for m in members if m.version != desired), key=lambda m: m.instance_id)
    kept = dict.fromkeys(previous_share, 0)
    demote: list[str] = []
    retire: list[str] = []
    cut: list[str] = []
    waiting: list[str] = []

    def takes_share(m: Member) -> bool:
        return m.version == previous and kept.get(m.zone, 0) < previous_share.get(m.zone, 0)

    def retire_when_idle(m: Member) -> None:
        if m.in_flight == 0 or m.drain_overdue:
            retire.append(m.instance_id)
            if m.in_flight != 0:
                cut.append(m.instance_id)
        else:
            waiting.append(m.instance_id)

    for state in (S.WARM, S.COLD):  # loaded ones first: they keep the share, a loading one may be surplus
        for m in (m for m in old if m.state is state):
            if takes_share(m):
                kept[m.zone] += 1
            elif state is S.WARM:
                retire_when_idle(m)
    for m in (m for m in old if m.state is S.SERVING):
        if takes_share(m):
            kept[m.zone] += 1
            if old_serving_may_go:
                demote.append(m.instance_id)
        elif old_serving_may_go:
            retire_when_idle(m)
    start = {} if previous is None else {z: n - kept.get(z, 0) for z, n in previous_share.items() if n > kept.get(z, 0)}
    return RollDecision(demote=tuple(demote), retire=tuple(retire), cut=tuple(cut), waiting=tuple(waiting),
                        start_previous=start)


def infer_previous(members: Iterable[Member], *, desired: str, known: Iterable[str]) -> str | None:
    """The previous version when the agent did not see the alias move (it started after): the version other than
    the desired one most of the pool's instances run, among those it can start; None if there is none."""
    counts: dict[str, int] = {}
    known = set(known)
    for m in members:
        if m.version != desired and m.version in known:
            counts[m.version] = counts.get(m.version, 0) + 1
    return max(sorted(counts), key=lambda v: counts[v]) if counts else None
