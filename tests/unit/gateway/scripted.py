"""A scripted engine client and a real router/token log around it, for session-level fault tests.

Each engine call takes the next script for the endpoint it was routed to: a
list of steps — `OPEN`, a token id, `("finish", id)`, an `EngineFailure` to
raise, or an `asyncio.Event` to wait on (a hung engine, or a pause the test
releases), or an `EngineToken` yielded as it is, or `SILENT`: no more tokens,
ended only by the attempt's late-token watch, as the engine client would end
it (`engine_left_routing`). Time is a `ManualClock`; nothing sleeps on the
wall clock except the attempt's lease poll (one `registry.refresh_interval`)
and the `SILENT` step's polling of the watch.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from common.clock import ManualClock
from contract.lease import Registration
from gateway.admission import Admission
from gateway.deps import Deps
from gateway.engine_client import LEFT_ROUTING, EngineFailure, EngineToken, Opened
from gateway.lease_registry import InMemoryLeaseRegistry
from gateway.metrics import GatewayMetrics
from gateway.recovery import StreamSession
from gateway.router import LeaseView, Router
from gateway.routing_table import StaticRoutingTable
from gateway.settings import GatewaySettings, RecoveryStrategy
from gateway.stream_request import StreamRequest
from gateway.token_log import Frame, MemoryTokenLog

OPEN = "open"
SILENT = "silent"


class ScriptedEngines:
    def __init__(self) -> None:
        self.scripts: dict[str, list[list[Any]]] = defaultdict(list)
        self.payloads: list[tuple[str, dict[str, Any], float]] = []
        self.endpoints: list[Any] = []  # the Endpoint of every call, in order

    def script(self, instance_id: str, *steps: Any) -> None:
        self.scripts[instance_id].append(list(steps))

    async def stream(self, endpoint, payload, *, first_token_timeout: float, stall_timeout: float, attempt_id: str,
                     watch=None, watch_after: float = 0.3):
        self.payloads.append((endpoint.instance_id, payload, first_token_timeout))
        self.endpoints.append(endpoint)
        for step in self.scripts[endpoint.instance_id].pop(0):
            if step == OPEN:
                yield Opened(endpoint.generation)
            elif step == SILENT:
                while (why := await watch()) is None:
                    await asyncio.sleep(0.005)
                raise EngineFailure(LEFT_ROUTING, why)
            elif isinstance(step, EngineFailure):
                raise step
            elif isinstance(step, asyncio.Event):
                await step.wait()
            elif isinstance(step, EngineToken):  # as the engine said it (cached_tokens, a finish)
                yield step
                if step.finish_reason is not None:
                    return
            elif isinstance(step, tuple):
                yield EngineToken(step[1], "length")
                return
            else:
                yield EngineToken(step, None)

    async def close(self) -> None:
        return None


class Harness:
    def __init__(self, tmp_model: Path, instances: list[str], **sections: Any) -> None:
        self.clock = ManualClock()
        self.settings = GatewaySettings(models=[{"alias": "m", "version": "v", "model_dir": tmp_model}], **sections)
        self.registry = InMemoryLeaseRegistry(timedelta(seconds=2), self.clock)
        self.instances = instances
        self.view = LeaseView(self.registry, refresh_interval=0.05, cached=False)
        self.router = Router(self.settings, StaticRoutingTable(self.settings.models), self.view,
                             Admission(self.settings.admission), self.clock)
        self.engines = ScriptedEngines()
        self.log = MemoryTokenLog(clock=self.clock)
        self.metrics = GatewayMetrics()
        self.deps = Deps(self.settings, self.router, self.engines, self.log, self.metrics, self.clock, "gw-1")  # type: ignore[arg-type]
        self.tokenizer = Tokenizer.from_file(str(tmp_model / "tokenizer.json"))
        self._n = 0

    async def register(self) -> None:
        for instance in self.instances:
            await self.registry.register(Registration(instance, f"http://{instance}", "v"))

    async def session(self, *, max_tokens: int = 4, prefer: str | None = None, **fields: Any) -> StreamSession:
        self._n += 1
        request = StreamRequest(
            request_id=f"cmpl-{self._n}", kind="completion", model="m", version="v", prompt_ids=[1, 2, 3],
            max_tokens=max_tokens, sampling={"temperature": 0.0}, stop=[], strategy=RecoveryStrategy.TOKEN_COMMIT_RESUME,
            deadline_wall=self.clock.wall() + 600, created=0, prefer_instance=prefer, **fields,
        )
        await self.log.create(request.request_id, request.to_dict(), owner="gw-1")
        return StreamSession(self.deps, request, self.tokenizer, received_at=self.clock.now())

    def budget(self):
        return self.router.admission.retry_budget


async def frames_of(items) -> list[Frame]:
    return [item async for item in items if isinstance(item, Frame)]
