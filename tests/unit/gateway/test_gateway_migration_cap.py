"""`recovery.max_migrations` counts every engine failure of a stream, across client resumes."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from common.clock import ManualClock
from gateway.engine_client import EngineFailure
from gateway.errors import RecoveryImpossible
from gateway.metrics import GatewayMetrics
from gateway.deps import Deps
from gateway.recovery import StreamSession
from gateway.stream_request import StreamRequest
from gateway.settings import GatewaySettings, RecoveryStrategy
from gateway.token_log import MemoryTokenLog
from lifeline.processes import built_model


class _Router:
    """Only the retry budget: this test never routes."""

    async def begin_retry(self, timeout: float) -> bool:
        return True

    def end_retry(self) -> None:
        pass


def _session_parts(max_migrations: int):
    model = built_model("tiny", 0)
    clock = ManualClock()
    settings = GatewaySettings.load(None, models=[{"alias": "tiny", "version": model.name, "model_dir": str(model)}],
                                    recovery={"max_migrations": max_migrations})
    log = MemoryTokenLog(clock=clock)
    deps = Deps(settings, _Router(), None, log, GatewayMetrics(), clock, "gw-1")  # type: ignore[arg-type]
    request = StreamRequest(
        request_id="cmpl-1", kind="completion", model="tiny", version=model.name, prompt_ids=[1, 2], max_tokens=16,
        sampling={}, stop=[], strategy=RecoveryStrategy.TOKEN_COMMIT_RESUME, deadline_wall=clock.wall() + 60, created=0,
    )
    return deps, log, request, Tokenizer.from_file(str(model / "tokenizer.json"))


async def _resume(deps: Deps, log: MemoryTokenLog, request: StreamRequest, tokenizer: Tokenizer, owner: str) -> StreamSession:
    """What the resume endpoint does: CAS the epoch as the new owner, rebuild the session from the log."""
    record = await log.get(request.request_id)
    assert await log.advance_epoch(request.request_id, record.epoch, owner=owner)
    frames = await log.frames_after(request.request_id, -1)
    return StreamSession.from_log(deps, request, tokenizer, epoch=record.epoch + 1, frames=frames, migrations=record.migrations)


async def test_the_migration_cap_holds_across_client_resumes():
    deps, log, request, tokenizer = _session_parts(max_migrations=2)
    await log.create(request.request_id, request.to_dict(), owner="gw-1")
    session = StreamSession(deps, request, tokenizer)
    await session._migrate(EngineFailure("connect"))
    assert session.migrations == 1

    resumed = await _resume(deps, log, request, tokenizer, owner="gw-2")  # the client reconnected, maybe elsewhere
    assert resumed.migrations == 1  # not 0: the count comes from the log
    await resumed._migrate(EngineFailure("stall"))
    assert (await log.get(request.request_id)).migrations == 2

    again = await _resume(deps, log, request, tokenizer, owner="gw-1")
    with pytest.raises(RecoveryImpossible) as refused:
        await again._migrate(EngineFailure("connection_lost"))
    assert refused.value.error_type == "migration_limit"
    record = await log.get(request.request_id)
    assert record.migrations == 2 and record.epoch == 4  # two migrations, two resumes
