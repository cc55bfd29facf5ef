"""The operator console: server-rendered pages under /console on the control plane's own process.

Fleet, catalog, cutovers and zonal shifts, and a live event timeline, for
people in an incident rather than for scripts. It holds no state of its
own and no queries of its own: every page reads through the domains'
service modules and every action calls the same service function as the
REST route, under the same roles, audited by the same middleware. See
docs/console.md.
"""

from __future__ import annotations

from fastapi import APIRouter


def build_console_router() -> APIRouter:
    from controlplane.console import cutover_controls, cutovers, drills, events, pages, signin

    console = APIRouter(include_in_schema=False)
    for router in (signin.router, pages.router, cutovers.router, cutover_controls.router, events.router,
                   drills.router):
        console.include_router(router)
    return console
