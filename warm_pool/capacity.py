"""The capacity plan: `contract/capacity.py`, re-exported here for the agent's code and its CLI.

It moved to `contract/` because the control plane serves the same plan
(`/api/v1/pool/plan`) and may not import `warm_pool`; one function, one record.
"""

from contract.capacity import (CapacityPlan, DrTier, InstanceCapacity, PlanError, PlanInputs, PlanRecord,
                               PlanRequest, RegionDemand, Step, TierCost, ZonePlan, _replay, plan, plan_inputs,
                               plan_record)

__all__ = ["CapacityPlan", "DrTier", "InstanceCapacity", "PlanError", "PlanInputs", "PlanRecord", "PlanRequest",
           "RegionDemand", "Step", "TierCost", "ZonePlan", "_replay", "plan", "plan_inputs", "plan_record"]
