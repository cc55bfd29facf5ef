from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request, Response

from contract.snapshot import RoutingSnapshot, if_none_match_hits
from controlplane.auth.dependencies import SnapshotReader
from controlplane.db import DbSession
from controlplane.deps import SettingsDep
from controlplane.snapshot import service
from controlplane.snapshot.body_cache import SnapshotBodyCache

router = APIRouter(tags=["snapshot"])


def _body_cache(request: Request) -> SnapshotBodyCache:
    return request.app.state.snapshot_body_cache


BodyCache = Annotated[SnapshotBodyCache, Depends(_body_cache)]


@router.get(
    "/snapshot",
    response_model=RoutingSnapshot,
    responses={304: {"description": "unchanged since If-None-Match"}},
)
def get_snapshot(
    session: DbSession,
    _: SnapshotReader,
    settings: SettingsDep,
    cache: BodyCache,
    if_none_match: Annotated[str | None, Header(max_length=200)] = None,
) -> Response:
    """Gateways poll this with If-None-Match and keep their last good copy when it fails.

    The tag (`"snapshot-<epoch>-<version>"`) is compared with the current
    one before the body is built, so an unchanged poll reads one row; a tag
    from another database's epoch never matches. `W/` tags, lists and `*`
    are honoured (RFC 9110 weak comparison). A changed snapshot is built
    once and its body sent to every poller (`body_cache`).
    """
    max_age = f"max-age={int(settings.snapshot_max_age.total_seconds())}"
    etag = service.current_etag(session)
    if if_none_match_hits(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag, "Cache-Control": max_age})
    label, body = cache.body(session, etag)  # may be newer than the version compared: labelled with its own
    return Response(body, media_type="application/json", headers={"ETag": label, "Cache-Control": max_age})
