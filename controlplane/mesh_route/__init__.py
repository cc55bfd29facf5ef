"""Mesh routes: a model's split across versions and zones, per header cohort, in one region or in all.

Desired routing state like a cluster: every write bumps the routing
version and writes one `mesh.route` event, so the snapshot
(controlplane/snapshot) carries the routes to the gateways
(gateway/mesh.py). The cutover mesh tier's built-in driver
(cutover/drivers/snapshot_mesh.py) re-weights them for a zone through
`service.put_route`; this domain knows nothing of cutovers beyond the
`RouteHolders` the composition root hands `delete_route`.
"""
