"""`GET /pool/plan?…` and `POST /pool/plan`: the capacity plan for a region, with its arithmetic (viewer)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from contract.pool_plan import PlanInputs, PlanRecord
from controlplane.auth.dependencies import Viewer
from controlplane.pool_plan import service

router = APIRouter(prefix="/pool", tags=["pool"])


@router.get("/plan", response_model=PlanRecord)
def get_plan(inputs: Annotated[PlanInputs, Query()], _: Viewer) -> PlanRecord:
    """The plan for the inputs `lifeline pool plan` takes, by their names (`zones=a,b,c`); nothing is stored."""
    return service.plan(inputs)


@router.post("/plan", response_model=PlanRecord)
def post_plan(inputs: PlanInputs, _: Viewer) -> PlanRecord:
    """The same plan for a JSON body of the same inputs; changes nothing (a computation, not a write)."""
    return service.plan(inputs)
