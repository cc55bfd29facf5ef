"""What each region's agent last reported: its snapshot version and every instance's verdict, pool state and lease.

One row per region (one agent watches a region), replaced by each newer
report. Read back with a staleness computed at read time from when the
control plane received it (its own clock), so an agent that stopped
reporting is shown as stale, never as the region's present.
"""
