"""The Alertmanager webhook receiver under /api/v1.

    POST /alerts/alertmanager     a delivery: each alert acted on once by its route   alertmanager (admin)

Alertmanager's side (`alertmanager.yml`):

    receivers:
      - name: lifeline
        webhook_configs:
          - url: https://controlplane.example/api/v1/alerts/alertmanager
            http_config: {authorization: {credentials_file: /etc/alertmanager/lifeline.token}}

A 2xx tells Alertmanager the delivery is done; anything else, it retries,
and the retry finds each alert already claimed (`duplicate`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from controlplane.alerts import service
from controlplane.alerts.schemas import AlertmanagerWebhook, WebhookResult
from controlplane.auth.dependencies import AlertSender
from controlplane.errors import NotFound

router = APIRouter(tags=["alerts"])


class AlertsNotConfigured(NotFound):
    error_type = "alerts_not_configured"


@router.post("/alerts/alertmanager", response_model=WebhookResult)
def receive_alerts(body: AlertmanagerWebhook, request: Request, principal: AlertSender) -> WebhookResult:
    """Act on a delivery's alerts by the alert routes file: a fault report to the escalation ladder, a drill run,
    or an event; a retried delivery changes nothing twice. 404 `alerts_not_configured` without a routes file;
    403 `unknown_alert_source` for a receiver the file does not name."""
    from cutover.endpoints import runtime_for
    from cutover.escalation import Fault
    from cutover.escalation_flow import escalate as run_ladder
    from cutover.scope import Scope, ScopeKind

    routes = request.app.state.alert_routes
    if routes is None:
        raise AlertsNotConfigured("this control plane takes no alerts: LIFELINE_CONTROLPLANE_ALERT_ROUTES_FILE "
                                  "is not set")

    def escalate(fault_id: str, kind: str, region: str, name: str, evidence: dict[str, Any],
                 zone: str | None) -> list[Any]:
        fault = Fault(fault_id, Scope(ScopeKind(kind), region, name), evidence, zone=zone)
        return run_ladder(runtime_for(request.app.state), fault, actor=principal.actor)

    results = service.receive(request.app.state.session_factory, routes, body, actor=principal.actor,
                              clock=request.app.state.clock, escalate=escalate,
                              dispatch=getattr(request.app.state, "drill_dispatch", None))
    return WebhookResult(alerts=results)
