"""What every tier driver shares: the verify-by-polling loop, restore, and the retry of unreachable systems.

A driver (cutover/drivers/*.py) implements `observe(target) -> (state,
evidence)` — one read of the real system — and `_write(desired)`;
`PollingDriver` turns them into the `cutover.drivers.base.TierDriver` interface:
`verify` polls until the system shows the expected state or the timeout
passes (raising `VerificationFailed` with the last observation), and
reports the time to effect from this driver's last `apply` of that target.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import ClassVar, Generic

from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from common.clock import Clock, SystemClock
from contract.routing_tier import RoutingTier
from cutover.drivers.base import (
    AnycastState,
    DnsState,
    DriverUnavailable,
    L7State,
    MeshState,
    S,
    Target,
    Verification,
    VerificationFailed,
)


def retry_unavailable(attempts: int = 3) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """Retry an idempotent call on DriverUnavailable only; DriverRejected is final."""
    return retry(
        retry=retry_if_exception_type(DriverUnavailable),
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=0.05, max=1.0),
        reraise=True,
    )


class PollingDriver(Generic[S]):
    """`verify` and `restore` built on a driver's `observe` and `apply`.

    A driver implements `observe(target) -> (state, evidence)` (one read of
    the real system) and `_write(desired)`; this base keeps the time of each
    apply per target so `verify` reports time to effect from the write.
    """

    tier: ClassVar[RoutingTier]
    poll_interval_s: float = 0.005

    def __init__(self, *, clock: Clock | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.clock = clock or SystemClock()
        self.sleep = sleep
        self._applied_at: dict[object, float] = {}

    # -- implemented by each driver
    def observe(self, target: Target) -> tuple[S, str]:
        raise NotImplementedError

    def _write(self, desired: S) -> None:
        raise NotImplementedError

    def client_cache_ttl_s(self, expected: S) -> int | None:
        """How long clients may still hold the state `expected` replaced (DNS TTLs); None elsewhere."""
        return None

    def internal_cache_ttl_s(self, expected: S) -> int | None:
        """The same for the long-TTL internal record, where the target has one (DNS); None elsewhere."""
        return None

    # -- the interface
    def read_state(self, target: Target) -> S:
        return self.observe(target)[0]

    def apply(self, desired: S) -> None:
        started = self.clock.now()  # time to effect counts the write itself
        self._write(desired)
        self._applied_at[desired.target] = started

    def verify(self, expected: S, timeout: timedelta) -> Verification:
        started = self.clock.now()
        applied_at = self._applied_at.get(expected.target)
        origin, measured_from = (applied_at, "apply") if applied_at is not None else (started, "verify")
        deadline = started + timeout.total_seconds()
        polls = 0
        while True:
            observed, evidence = self.observe(expected.target)
            now = self.clock.now()
            polls += 1
            matched = expected.matches(observed)
            if matched or now >= deadline:
                verification = Verification(
                    tier=self.tier, expected=expected, observed=observed, verified=matched,
                    evidence=evidence, polls=polls, time_to_effect_s=max(0.0, now - origin),
                    measured_from=measured_from,
                    client_cache_ttl_s=self.client_cache_ttl_s(expected),
                    internal_cache_ttl_s=self.internal_cache_ttl_s(expected),
                )
                if matched:
                    return verification
                raise VerificationFailed(
                    f"{self.tier} {expected.target.model_dump(mode='json', exclude={'tier'})}: expected "
                    f"{_describe(expected)}, still {_describe(observed)} after "
                    f"{timeout.total_seconds():g}s ({polls} polls)",
                    verification=verification,
                )
            self.sleep(min(self.poll_interval_s, max(0.0, deadline - now)))

    def restore(self, before: S, timeout: timedelta) -> Verification:
        self.apply(before)
        return self.verify(before, timeout)


def _describe(state: DnsState | AnycastState | L7State | MeshState) -> str:
    return str(state.model_dump(mode="json", exclude={"tier", "target"}))
