"""Links from the console to the Grafana dashboards of deploy/monitoring, over the window a thing ran in.

The dashboards' uids and panel ids are fixed (deploy/monitoring/dashboards.py);
tests/integration/deploy/test_monitoring_dashboards.py checks that every
panel named here exists there. With no `LIFELINE_CONTROLPLANE_GRAFANA_URL`
the console shows no such links.
"""

from __future__ import annotations

from datetime import datetime, timedelta

# (dashboard uid, panel id)
ESCALATION_DECISIONS = ("lifeline-cutovers", 1)
DRILL_RUNS = ("lifeline-cutovers", 3)
MIGRATIONS = ("lifeline-streams", 2)
RECOVERY_GAP = ("lifeline-streams", 3)
LINKED_PANELS = (ESCALATION_DECISIONS, DRILL_RUNS, MIGRATIONS, RECOVERY_GAP)
MARGIN = timedelta(minutes=5)  # before and after: what led up to it, and how it settled


def panel_link(grafana_url: str | None, panel: tuple[str, int], start: datetime | None,
               end: datetime | None) -> str | None:
    """`/d/<uid>?viewPanel=<id>` from `start` − 5 min to `end` + 5 min (still running: to now); None without a
    Grafana or a start."""
    if not grafana_url or start is None:
        return None
    uid, panel_id = panel
    until = "now" if end is None else str(int((end + MARGIN).timestamp() * 1000))
    return (f"{grafana_url.rstrip('/')}/d/{uid}?viewPanel={panel_id}"
            f"&from={int((start - MARGIN).timestamp() * 1000)}&to={until}")
