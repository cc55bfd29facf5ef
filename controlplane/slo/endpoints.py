"""GET /api/v1/slo/{model}?format=json|md|html: the model's SLO document, generated on request (viewer)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from controlplane.auth.dependencies import Viewer
from controlplane.db import DbSession
from controlplane.deps import ClockDep, NamePath, SettingsDep
from controlplane.slo import export, service
from controlplane.slo.schemas import SloDocument

router = APIRouter(tags=["slo"])


@router.get("/slo/{model}", response_model=SloDocument,
            responses={200: {"content": {"text/markdown": {}, "text/html": {}}}})
def slo_document(model: NamePath, request: Request, session: DbSession, _: Viewer, clock: ClockDep,
                 settings: SettingsDep, format: Annotated[export.Format, Query()] = "json") -> Any:
    document = service.build(session, model=model, clock=clock,
                             gateway_stale_after=settings.gateway_report_stale_after,
                             agent_stale_after=settings.agent_report_stale_after,
                             dns=request.app.state.dns_ttls)
    if format == "json":
        return document
    return Response(export.render(document, format), media_type=export.MEDIA_TYPES[format])
