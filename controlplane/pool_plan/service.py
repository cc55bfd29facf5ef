"""Run the plan; refuse inputs no plan can use with a typed 422 naming the input."""

from __future__ import annotations

from common.logs import get_logger
from contract.pool_plan import PlanInputs, PlanRecord
from controlplane.errors import InvalidInput
from warm_pool.capacity import PlanError, plan_record

log = get_logger(__name__)


def plan(inputs: PlanInputs) -> PlanRecord:
    """The plan of `inputs`; InvalidInput (422, `param` the input's name) when no plan can be made of them."""
    try:
        record = plan_record(inputs)
    except PlanError as exc:
        raise InvalidInput(str(exc), param=exc.param) from None
    log.info("capacity plan", region=record.region, tier=str(record.tier), required_serving=record.required_serving,
             warm=sum(z.warm for z in record.zones), survives_zone_loss=record.survives_zone_loss)
    return record
