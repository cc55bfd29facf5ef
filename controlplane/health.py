"""Liveness and readiness of the control-plane process.

`/healthz/live` answers from the event loop and touches nothing else: it
says the process runs, even while the database hangs every worker thread.
`/healthz/ready` runs `SELECT 1` on a thread of its own limiter, so it is
not queued behind requests stuck on the database, and answers 503
`database_unavailable` when the database does not answer within its
timeouts. Neither needs a token.
"""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from controlplane.errors import DatabaseUnavailable

router = APIRouter(tags=["health"])


@router.get("/healthz/live")
async def live() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/healthz/ready", responses={503: {"description": "the database does not answer"}})
async def ready(request: Request) -> JSONResponse:
    state = request.app.state
    if getattr(state, "ready_limiter", None) is None:
        state.ready_limiter = anyio.CapacityLimiter(2)

    def probe() -> None:
        with state.read_session_factory() as session:
            session.execute(text("SELECT 1"))

    try:
        await anyio.to_thread.run_sync(probe, limiter=state.ready_limiter)
    except Exception as exc:  # noqa: BLE001 - any failure to answer is "not ready"
        error = DatabaseUnavailable(f"the database does not answer ({type(exc).__name__})", retry_after_s=1)
        return JSONResponse(error.body(), status_code=error.status_code, headers=error.headers())
    return JSONResponse({"status": "ready"})
