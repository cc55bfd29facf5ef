"""A stand-in for the control plane's gateway-facing endpoints, as a real process.

Speaks exactly the contract a gateway uses (`contract.snapshot`,
`contract.events`): `GET /api/v1/snapshot` with ETag / If-None-Match,
`PUT /api/v1/gateways/{replica}`, `GET /api/v1/gateways`,
`POST /api/v1/events/dataplane`, and the agent's `PUT /api/v1/agents/{region}`
(`contract.events.AgentReport`; `GET /api/v1/agents`). The snapshot it serves is whatever body was
last posted to `POST /_standin/snapshot` — deliberately unvalidated, so a
test can serve one the gateways must refuse. State is in memory: a restart
starts empty, as a control plane restored from nothing would.

It stands in until the control plane serves contract-shaped snapshots and
these endpoints (issue 8, control-plane side); the gateway side is then
tested against `lifeline controlplane serve` itself.

    python -m bench.controlplane_standin --port 8700 [--token T]
"""

from __future__ import annotations

import argparse
import json

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from contract.events import AgentReport, EventBatch, GatewayReport
from contract.snapshot import etag_for, if_none_match_hits


def create_app(token: str | None = None) -> FastAPI:
    app = FastAPI(title="control plane stand-in")
    state: dict = {"body": None, "version": 0, "gateways": {}, "agents": {}, "events": [], "dropped": 0,
                   "snapshot_gets": 0}

    def authorized(request: Request) -> bool:
        return token is None or request.headers.get("authorization") == f"Bearer {token}"

    @app.get("/api/v1/snapshot")
    async def snapshot(request: Request) -> Response:
        if not authorized(request):
            return JSONResponse({"error": {"type": "authentication_error"}}, status_code=401)
        state["snapshot_gets"] += 1
        if state["body"] is None:
            return JSONResponse({"error": {"type": "not_found_error"}}, status_code=404)
        etag = etag_for(state["version"])
        if if_none_match_hits(request.headers.get("if-none-match"), etag):
            return Response(status_code=304, headers={"ETag": etag})
        return Response(state["body"], media_type="application/json", headers={"ETag": etag})

    @app.put("/api/v1/gateways/{replica_id}")
    async def report(replica_id: str, request: Request) -> Response:
        if not authorized(request):
            return JSONResponse({"error": {"type": "authentication_error"}}, status_code=401)
        body = GatewayReport.model_validate_json(await request.body())
        state["gateways"][replica_id] = body.model_dump(mode="json")
        return JSONResponse(state["gateways"][replica_id])

    @app.get("/api/v1/gateways")
    async def gateways() -> dict:
        return {"gateways": list(state["gateways"].values())}

    @app.put("/api/v1/agents/{region}")
    async def agent_report(region: str, request: Request) -> Response:
        if not authorized(request):
            return JSONResponse({"error": {"type": "authentication_error"}}, status_code=401)
        body = AgentReport.model_validate_json(await request.body())
        state["agents"][region] = body.model_dump(mode="json")
        return JSONResponse(state["agents"][region])

    @app.get("/api/v1/agents")
    async def agents() -> list:
        return list(state["agents"].values())

    @app.post("/api/v1/events/dataplane", status_code=202)
    async def events(request: Request) -> Response:
        if not authorized(request):
            return JSONResponse({"error": {"type": "authentication_error"}}, status_code=401)
        batch = EventBatch.model_validate_json(await request.body())
        state["events"].extend(e.model_dump(mode="json") for e in batch.events)
        state["dropped"] += batch.dropped
        return JSONResponse({"accepted": len(batch.events)}, status_code=202)

    @app.post("/_standin/snapshot")
    async def set_snapshot(request: Request) -> dict:
        raw = await request.body()
        try:
            version = int(json.loads(raw)["version"])
        except (ValueError, KeyError, TypeError):
            version = int(request.headers["x-snapshot-version"])
        state["body"], state["version"] = raw, version
        return {"version": version}

    @app.get("/_standin/state")
    async def get_state() -> dict:
        return {k: v for k, v in state.items() if k != "body"}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", default=None)
    args = parser.parse_args()
    uvicorn.run(create_app(args.token), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
