"""Alertmanager's alerts, acted on once each: a fault report, a drill run, or an event.

    receive(payload)     for each alert: claim its key → act by its route → one `alert.received` event
                         (or `alert.resolved`), in the unit of work that marks the key done

A firing alert acts by the first route that matches it (alerts/routes.py):

    fault   `cutover.escalation_flow.escalate` with fault id `alert:<fingerprint>@<startsAt>`: the
            regional agent's ladder, under the same safety rules, naming the alert as evidence. The
            ladder resumes a fault by its id, so a retried delivery could never cut over twice even
            without the claim.
    drill   a run of the named drill, `trigger: alert` (zone and region runs wait for approval)
    event   the event alone

A resolved alert is an event: it rolls nothing back (returning a scope is
an operator's decision, or the agent's once its own view recovers).
Nothing acts for an alert no route matches, or one whose route names a label
the alert does not carry: that is recorded, `unrouted` or `failed`, with
the reason. One delivery's alerts are handled one by one; one that fails
does not stop the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from common.clock import Clock
from common.errors import LifelineError
from common.logs import get_logger
from controlplane.alerts.models import AlertDelivery
from controlplane.alerts.routes import AlertRoute, AlertRoutes
from controlplane.alerts.schemas import Alert, AlertmanagerWebhook, AlertResult
from controlplane.db import session_scope
from controlplane.errors import Forbidden
from controlplane.event import service as events

log = get_logger(__name__)

# A claim older than this whose action never finished is taken again (the process acting on it died).
STALE_CLAIM = timedelta(minutes=2)


class UnknownAlertSource(Forbidden):
    error_type = "unknown_alert_source"


def receive(factory: sessionmaker[Session], routes: AlertRoutes, payload: AlertmanagerWebhook, *, actor: str,
            clock: Clock, escalate: Callable[..., list[Any]], dispatch: Callable[[int], None] | None
            ) -> list[AlertResult]:
    """Act on every alert of the delivery; what each came to. `escalate(fault_id, scope, evidence, zone)` runs the
    ladder; `dispatch(run_id)` starts a drill run once its row is committed (None: it waits for a runner)."""
    if payload.receiver != routes.source.receiver:
        raise UnknownAlertSource(f"alerts from receiver {payload.receiver!r}: this control plane takes them only "
                                 f"from {routes.source.receiver!r} (alert routes file, [source])")
    results = []
    for alert in payload.alerts:
        route = routes.route_for(alert.labels) if alert.status == "firing" else None
        action = "event" if alert.status == "resolved" else (route.action if route else "event")
        result = AlertResult(fingerprint=alert.fingerprint, alertname=alert.labels.get("alertname", ""),
                             status=alert.status, action=action, outcome="duplicate")
        claim = _claim(factory, alert, action, clock)
        if claim != "claimed":
            result.outcome = claim
            results.append(result)
            continue
        try:
            result.outcome, result.detail = _act(factory, alert, route, actor=actor, clock=clock,
                                                 escalate=escalate, dispatch=dispatch)
        except LifelineError as error:
            result.outcome, result.detail = "failed", {"error": error.error_type, "message": error.message}
        _finish(factory, alert, result, actor=actor, clock=clock)
        log.info("alert handled", alertname=result.alertname, fingerprint=alert.fingerprint, status=alert.status,
                 action=action, outcome=result.outcome)
        results.append(result)
    return results


def _claim(factory: sessionmaker[Session], alert: Alert, action: str, clock: Clock) -> str:
    """`claimed` (act on it now), `duplicate` (acted on already) or `in_progress` (another delivery is acting)."""
    now = clock.utcnow()
    try:
        with session_scope(factory) as session:
            session.add(AlertDelivery(key=alert.key(), alertname=alert.labels.get("alertname", "")[:200],
                                      action=action, state="acting", deliveries=1, received_at=now, updated_at=now))
        return "claimed"
    except IntegrityError:
        pass
    with session_scope(factory) as session:
        row = session.get(AlertDelivery, alert.key(), with_for_update=True)
        if row is None:  # pragma: no cover - deliveries are never deleted
            return "in_progress"
        row.deliveries += 1
        if row.state == "acting" and now - row.updated_at > STALE_CLAIM:
            row.updated_at = now
            return "claimed"
        return "duplicate" if row.state == "done" else "in_progress"


def _act(factory: sessionmaker[Session], alert: Alert, route: AlertRoute | None, *, actor: str, clock: Clock,
         escalate: Callable[..., list[Any]], dispatch: Callable[[int], None] | None) -> tuple[str, dict[str, Any]]:
    if alert.status == "resolved":
        return "recorded", {}
    if route is None:
        return "unrouted", {"reason": "no route of the alert routes file matches this alert"}
    if route.action == "event":
        return "recorded", {}
    if route.action == "drill":
        from controlplane.drill import service as drills

        with session_scope(factory) as session:
            definition = drills.get_definition_or_raise(session, name=route.drill or "")
            run = drills.create_run(session, definition=definition, trigger="alert", actor=actor, clock=clock)
            run_id, state = run.id, run.state
        if dispatch is not None and state == "scheduled":
            dispatch(run_id)
        return "drill_requested", {"drill": route.drill, "run": run_id, "state": state}
    labels = alert.labels
    missing = [name for name in _scope_labels(route) if not labels.get(name)]
    if missing:
        return "failed", {"reason": f"the route's {route.scope} scope needs label(s) {missing}, which this alert "
                                    "does not carry"}
    region = labels[route.region_label]
    name = {"region": region, "zone": labels.get(route.zone_label), "instance": labels.get(route.instance_label)}
    fault_id = f"alert:{alert.fingerprint}@{alert.startsAt.isoformat()}"
    evidence = {"source": "alertmanager", "alertname": labels.get("alertname"), "labels": labels,
                "annotations": alert.annotations, "starts_at": alert.startsAt.isoformat(),
                "generator_url": alert.generatorURL}
    decisions = escalate(fault_id, route.scope, region, name[route.scope or "region"], evidence,
                         labels.get(route.zone_label) if route.scope == "instance" else None)
    return "escalated", {"fault_id": fault_id, "decisions": [
        {"action": d.action.value, "rung": d.rung, "tiers": [str(t) for t in d.tiers], "reason": d.reason}
        for d in decisions]}


def _scope_labels(route: AlertRoute) -> list[str]:
    return {"region": [route.region_label], "zone": [route.region_label, route.zone_label],
            "instance": [route.region_label, route.instance_label]}[route.scope or "region"]


def _finish(factory: sessionmaker[Session], alert: Alert, result: AlertResult, *, actor: str, clock: Clock) -> None:
    labels = alert.labels
    scope = f"region:{labels['region']}" if labels.get("region") else "alerts"
    if labels.get("region") and labels.get("zone"):
        scope += f"/zone:{labels['zone']}"
    summary = alert.annotations.get("summary") or alert.annotations.get("description") or ""
    with session_scope(factory) as session:
        row = session.get(AlertDelivery, alert.key(), with_for_update=True)
        assert row is not None
        row.state, row.outcome, row.detail, row.updated_at = "done", result.outcome, result.detail, clock.utcnow()
        events.record(session, kind="alert.resolved" if alert.status == "resolved" else "alert.received",
                      actor=actor, scope=scope, clock=clock, started_at=alert.startsAt,
                      outcome="failed" if result.outcome == "failed" else "succeeded",
                      reason=f"{result.alertname} {alert.status}: {summary}"[:2000] if summary else
                      f"{result.alertname} {alert.status}",
                      after={"fingerprint": alert.fingerprint, "labels": labels, "action": result.action,
                             "outcome": result.outcome, "generator_url": alert.generatorURL, **result.detail})
