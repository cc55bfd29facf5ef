from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Response
from fastapi.responses import JSONResponse

from controlplane.auth.dependencies import Viewer
from controlplane.db import DbSession
from controlplane.deps import SettingsDep
from contract.snapshot import if_none_match_hits
from controlplane.snapshot import service

router = APIRouter(tags=["snapshot"])


@router.get(
    "/snapshot",
    responses={200: {"description": "the desired routing state"}, 304: {"description": "unchanged since If-None-Match"}},
)
def get_snapshot(
    session: DbSession,
    _: Viewer,
    settings: SettingsDep,
    if_none_match: Annotated[str | None, Header(max_length=200)] = None,
) -> Any:
    """Gateways poll this with If-None-Match and keep their last good copy when it fails."""
    snapshot = service.build(session)
    etag = service.etag_for(snapshot["version"])
    headers = {"ETag": etag, "Cache-Control": f"max-age={int(settings.snapshot_max_age.total_seconds())}"}
    if if_none_match_hits(if_none_match, etag):
        return Response(status_code=304, headers=headers)
    return JSONResponse(snapshot, headers=headers)
