"""The four routing tiers, fastest first (ARCHITECTURE invariant 8): the one name for a tier on both sides.

A cutover acts at one (its tier, each step's tier), every routing change
the control plane's event log records names one (`routing_tier`), and so
does every event the data plane reports (`contract.events.DataPlaneEvent`):
a post-mortem filters all of them by the same four values.
"""

from __future__ import annotations

from enum import StrEnum


class RoutingTier(StrEnum):
    L7 = "l7"
    MESH = "mesh"
    ANYCAST = "anycast"
    DNS = "dns"
