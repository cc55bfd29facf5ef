"""What each gateway replica last reported: the snapshot it applied, the endpoints it routes to.

One row per replica, replaced by each newer report. Read back with a
staleness computed at read time from when the control plane received it
(its own clock, not the gateway's), so a replica that stopped reporting is
shown as stale and its snapshot version is never taken as current.
"""
