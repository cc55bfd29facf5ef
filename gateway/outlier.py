"""Local outlier detection: eject an endpoint after consecutive failures, as Envoy does.

The lease registry removes a dead engine from routing within its TTL; this
covers the window before, on this replica only. Modelled on Envoy's outlier
detection (`consecutive_5xx`, `consecutive_local_origin_failure`,
`base_ejection_time`, `max_ejection_time`, `max_ejection_percent`):

- An endpoint is ejected after `consecutive_5xx` failures in a row answered by
  the engine (5xx, an SSE error event, a malformed stream), or after
  `consecutive_local_failures` failures of the connection itself (refused,
  reset, a stall, a lapsed lease, a foreign generation). Any success resets
  the count. One transient 500 ejects nothing at the defaults.
- The n-th ejection lasts `base_ejection_time × n`, capped at
  `max_ejection_time`; an endpoint that stays healthy for one base time after
  its ejection ended forgets one step (Envoy's decay).
- Engine-answered failures eject at most `max_ejection_percent` of a
  version's endpoints at once, and never the last one: a 5xx over the cap is
  counted but not ejected, so transient errors cannot empty the fleet.
  A connection that was refused or reset, a lapsed lease or a foreign
  generation ejects regardless of the cap (invariant 2: an endpoint whose
  connection failed is suppressed at once): nothing there can answer, and
  its lease will lapse anyway. A connect timeout or a stall (`SLOW_FAILURES`)
  says only that the engine was slow — as a busy survivor is on a loaded
  machine while the streams of a dead peer arrive — so it ejects within the
  cap, like a 5xx: it never empties the fleet of an engine that may be fine.
- An engine that streams output without token ids (`no_token_ids`: too old
  a vLLM) is ejected at its first such failure, regardless of the cap: it
  cannot serve any stream correctly. `incompatible()` tells the router, so
  a request that finds only such engines is refused `engine_incompatible`.

Keys are `(instance_id, generation)`, so a restarted engine (new generation)
starts clean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.clock import Clock
from common.logs import get_logger
from gateway.settings import OutlierConfig

log = get_logger(__name__)

EndpointKey = tuple[str, int | None]

# Failures of the connection itself (Envoy's "local origin"); everything else the engine answered.
LOCAL_FAILURES = frozenset({"connect", "timeout", "connection_lost", "stall", "lease_lapsed", "stale_generation"})
# Local failures that do not show the engine gone, only slow: they eject within the cap.
SLOW_FAILURES = frozenset({"timeout", "stall"})
# The engine cannot serve any stream (gateway.engine_connection.NO_TOKEN_IDS): eject at once, regardless of the cap.
INCOMPATIBLE_FAILURES = frozenset({"no_token_ids"})


@dataclass
class _Record:
    consecutive_5xx: int = 0
    consecutive_local: int = 0
    ejections: int = 0  # the multiplier of the next ejection time
    ejected_until: float = 0.0
    reason: str = ""  # the failure that caused the current ejection


class OutlierDetector:
    def __init__(self, config: OutlierConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self._records: dict[EndpointKey, _Record] = {}

    def ejected(self, key: EndpointKey) -> bool:
        record = self._records.get(key)
        return record is not None and record.ejected_until > self.clock.now()

    def incompatible(self, key: EndpointKey) -> bool:
        """Ejected now because the engine cannot serve streams at all (`INCOMPATIBLE_FAILURES`)."""
        record = self._records.get(key)
        return record is not None and record.ejected_until > self.clock.now() and record.reason in INCOMPATIBLE_FAILURES

    def success(self, key: EndpointKey) -> None:
        record = self._records.get(key)
        if record is None:
            return
        record.consecutive_5xx = record.consecutive_local = 0
        base = self.config.base_ejection_time.total_seconds()
        if record.ejections and self.clock.now() > record.ejected_until + base:
            record.ejections -= 1
        if not record.ejections and not record.ejected_until > self.clock.now():
            del self._records[key]

    def failure(self, key: EndpointKey, reason: str, *, peers: list[EndpointKey]) -> bool:
        """Count a failure of `key`; True if it is ejected now. `peers`: the version's endpoints, `key` among them."""
        record = self._records.setdefault(key, _Record())
        local = reason in LOCAL_FAILURES
        incompatible = reason in INCOMPATIBLE_FAILURES
        if local:
            record.consecutive_local += 1
            reached = record.consecutive_local >= self.config.consecutive_local_failures
        else:
            record.consecutive_5xx += 1
            reached = incompatible or record.consecutive_5xx >= self.config.consecutive_5xx
        now = self.clock.now()
        if not reached or record.ejected_until > now:
            return record.ejected_until > now
        capped = reason in SLOW_FAILURES or not (local or incompatible)
        if capped and not self._room_to_eject(key, peers):
            log.warning("endpoint not ejected: the ejection cap is reached", instance=key[0], generation=key[1], reason=reason)
            return False
        record.ejections += 1
        duration = min(self.config.base_ejection_time.total_seconds() * record.ejections,
                       self.config.max_ejection_time.total_seconds())
        record.ejected_until = now + duration
        record.reason = reason
        record.consecutive_5xx = record.consecutive_local = 0
        log.warning("endpoint ejected", instance=key[0], generation=key[1], reason=reason, seconds=duration,
                    ejections=record.ejections)
        return True

    def _room_to_eject(self, key: EndpointKey, peers: list[EndpointKey]) -> bool:
        others = [p for p in peers if p != key]
        total = len(others) + 1
        already = sum(1 for p in others if self.ejected(p))
        cap = min(math.floor(total * self.config.max_ejection_percent / 100), total - 1)  # never the last one
        return already + 1 <= cap
