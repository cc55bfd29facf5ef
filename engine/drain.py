"""A planned shutdown (SIGTERM) in the order that loses no request.

    1. step down: go DRAINING (not ready) and release the lease, so gateways
       drop this endpoint at once instead of a TTL later;
    2. wait `drain_unroute_wait` while gateways catch up; anything still routed
       here is refused with a 503 `engine_draining` the gateway migrates on;
    3. let in-flight requests finish, up to `drain_timeout`;
    4. end the rest with an SSE error event of type `engine_draining`
       (`contract.identity.DRAINING_ERROR_TYPE`): the gateway resumes them
       elsewhere from its committed prefix, as after a crash, but nothing
       crashed;
    5. only then let uvicorn stop listening and run the lifespan's shutdown.

Uvicorn on its own does the reverse (stop listening, wait for connections,
then the lifespan), so the engine stayed ready and leased while its socket
closed. `DrainingServer` (engine.server) calls `drain()` on the first SIGTERM;
a second SIGTERM, or SIGINT, falls back to uvicorn's immediate shutdown.
"""

from __future__ import annotations

import asyncio
import faulthandler
import sys

from common.logs import get_logger
from contract.identity import DRAINING_ERROR_TYPE
from engine.lease_client import LeaseClient
from engine.lifecycle import LifecycleEvent
from engine.runtime import EngineRuntime
from engine.scheduler import ErrorEvent
from engine.serving import OpenAIServing

log = get_logger(__name__)

# After ending the stragglers, how long their streams get to flush the error event.
_FLUSH_S = 5.0
# uvicorn's own wait for open connections after the drain (engine.server's timeout_graceful_shutdown), and what
# the lifespan's shutdown may take beyond it (the decode loop's join, the checkpoint writer's close).
GRACEFUL_SHUTDOWN_S = 10.0
_SHUTDOWN_SLACK_S = 15.0


class Drainer:
    def __init__(self, runtime: EngineRuntime, serving: OpenAIServing, lease: LeaseClient | None) -> None:
        self.runtime = runtime
        self.serving = serving
        self.lease = lease
        self.started = False
        self._stepped_down = False

    async def step_down(self) -> None:
        """Not ready, lease released. Idempotent: the lifespan's shutdown calls it too."""
        if self._stepped_down:
            return
        self._stepped_down = True
        self.runtime.apply(LifecycleEvent.DRAIN_STARTED)
        if self.lease is not None:
            await self.lease.stop()

    async def drain(self) -> None:
        if self.started:
            return
        self.started = True
        settings, clock = self.runtime.settings, self.runtime.clock
        began = clock.now()
        # A shutdown that outlives every bound above is stuck somewhere: leave every thread's stack in the log
        # before the orchestrator's SIGKILL erases the evidence.
        faulthandler.dump_traceback_later(settings.drain_unroute_wait.total_seconds()
                                          + settings.drain_timeout.total_seconds() + _FLUSH_S + GRACEFUL_SHUTDOWN_S
                                          + _SHUTDOWN_SLACK_S, file=sys.stderr)
        await self.step_down()
        log.info("drain started: lease released, not ready", in_flight=len(self.serving.in_flight),
                 unroute_wait_s=settings.drain_unroute_wait.total_seconds(),
                 drain_timeout_s=settings.drain_timeout.total_seconds())
        await asyncio.sleep(settings.drain_unroute_wait.total_seconds())
        ended = 0
        try:
            await asyncio.wait_for(self.serving.wait_idle(), settings.drain_timeout.total_seconds())
        except TimeoutError:
            event = ErrorEvent("engine is shutting down; continue this request on another engine",
                               error_type=DRAINING_ERROR_TYPE, code=503)
            ended = self.serving.end_in_flight(event)
            log.warning("drain deadline passed; ending in-flight requests", error_type=DRAINING_ERROR_TYPE, ended=ended)
            try:
                await asyncio.wait_for(self.serving.wait_idle(), _FLUSH_S)
            except TimeoutError:
                log.error("in-flight requests did not end after the drain event", left=len(self.serving.in_flight))
        log.info("drained", ended=ended, drain_s=round(clock.now() - began, 3))
