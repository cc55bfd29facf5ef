"""The Fleet and the Catalog pages, and the catalog's alias actions.

Reads go through the domains' service modules (topology, gateway_report,
agent_report, weight_catalog) on the read-only session factory; writes through the same
service calls the REST routes make, in one unit of work, audited by the
same middleware (the actor is the session's token, as with a bearer token).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel

from common.errors import LifelineError
from controlplane.agent_report import service as agent_report_service
from controlplane.auth.roles import Role
from controlplane.console import session as console_session
from controlplane.console.web import (
    SECURITY_HEADERS,
    Form,
    current_user,
    guard_action,
    parse,
    redirect,
    render,
    run_action,
    to_sign_in,
    unit_of_work,
)
from controlplane.deps import NamePath
from controlplane.gateway_report import service as gateway_report_service
from controlplane.topology import repository as topology_repository
from controlplane.topology import service as topology_service
from controlplane.types import Name
from weight_catalog import aliases as catalog_aliases
from weight_catalog import repository as catalog_repository
from weight_catalog import service as catalog_service
from weight_catalog.schemas import PromoteRequest
from weight_catalog.schemas import RollbackRequest as CatalogRollback

router = APIRouter()


class AliasForm(BaseModel):
    """The promote form's alias field, validated as the REST path's alias name is."""

    alias: Name


# --- Fleet ---------------------------------------------------------------------------------------------------------

def _agent_view(report: Any) -> dict[str, Any] | None:
    """A region's agent report as the page shows it: its instances by id, each marked with the report's staleness.

    A stale report's verdicts and pool states are what the agent last said,
    not what holds now: every cell drawn from it carries `stale`.
    """
    if report is None:
        return None
    return {"agent_id": report.agent_id, "received_at": report.received_at, "age_s": report.age_s,
            "stale": report.stale, "snapshot_version": report.snapshot_version,
            "foreign_epoch": report.foreign_epoch, "snapshot_epoch": report.snapshot_epoch,
            "instances": {i.instance_id: i for i in report.instances}}


def fleet_view(request: Request) -> dict[str, Any]:
    """Regions → zones → clusters and instances (with the agent's verdicts), and every gateway's applied snapshot."""
    state = request.app.state
    clock = state.clock
    stale_after: timedelta = state.settings.gateway_report_stale_after
    agent_stale_after: timedelta = state.settings.agent_report_stale_after
    regions: list[dict[str, Any]] = []
    with state.read_session_factory() as session:
        zones_by_region = topology_repository.zones_by_region(session)
        clusters = topology_service.list_clusters(session)
        gateways = gateway_report_service.list_reports(session, clock=clock, stale_after=stale_after)
        agents = {r.region: r for r in agent_report_service.list_reports(session, clock=clock,
                                                                        stale_after=agent_stale_after)}
        for region in topology_service.list_regions(session):
            registry_error = None
            try:
                instances = topology_service.observed_instances(session, region=region.name,
                                                                reader=state.lease_reader, clock=clock)
            except LifelineError as exc:  # lease_registry_unavailable: say so, never show an empty fleet
                instances, registry_error = [], f"{exc.error_type}: {exc.message}"
            agent = _agent_view(agents.get(region.name))
            leased = {i.instance_id for i in instances}
            # What the agent knows that holds no lease: cold or warm pool instances, ones whose lease lapsed away.
            unleased = sorted((i for i in (agent["instances"].values() if agent else []) if i.instance_id not in leased),
                              key=lambda i: (i.zone, i.instance_id))
            names = list(zones_by_region.get(region.name, []))
            names += sorted({i.zone for i in instances if i.zone not in names}
                            | {c.zone for c in clusters if c.region == region.name and c.zone
                               and c.zone not in names})
            zones = []
            for zone in names:
                zones.append({
                    "name": zone,
                    "clusters": [c for c in clusters if c.region == region.name and c.zone == zone],
                    "instances": sorted((i for i in instances if i.zone == zone),
                                        key=lambda i: (i.instance_id, -i.generation)),
                })
            regions.append({
                "name": region.name,
                "description": region.description,
                "zones": zones,
                "region_clusters": [c for c in clusters if c.region == region.name and not c.zone],
                "other_instances": [i for i in instances if i.zone not in names],
                "registry_error": registry_error,
                "gateways": [g for g in gateways if g.region == region.name],
                "agent": agent,
                "agent_only": unleased,
            })
    known = {r["name"] for r in regions}
    return {"regions": regions, "orphan_gateways": [g for g in gateways if g.region not in known],
            "now": clock.utcnow(), "stale_after_s": stale_after.total_seconds(),
            "agent_stale_after_s": agent_stale_after.total_seconds(), "poll_s": FLEET_POLL_S}


# How often an open Fleet page asks for a fresh body (htmx `every`); each poll re-checks the session.
FLEET_POLL_S = 2


@router.get("/console/fleet", include_in_schema=False, name="console.fleet")
def fleet(request: Request) -> Response:
    user = current_user(request)
    if user is None:
        return to_sign_in(request)
    return render(request, "fleet.jinja", user=user, section="fleet", **fleet_view(request))


@router.get("/console/fleet/live", include_in_schema=False, name="console.fleet_live")
def fleet_live(request: Request) -> Response:
    """The Fleet page's body alone, for htmx to swap in every FLEET_POLL_S seconds.

    Signed out, expired or revoked: 401 and no body, which htmx does not
    swap in; `console.js` then says the view stopped, so a page left open
    never passes off its last picture as live.
    """
    user = current_user(request)
    if user is None:
        return Response("signed out", status_code=401, media_type="text/plain", headers=SECURITY_HEADERS)
    return render(request, "_fleet_body.jinja", user=user, **fleet_view(request))


# --- Catalog -------------------------------------------------------------------------------------------------------

def catalog_view(request: Request) -> dict[str, Any]:
    models: dict[str, dict[str, Any]] = {}
    with request.app.state.read_session_factory() as session:
        for version in catalog_service.list_versions(session):
            entry = models.setdefault(version.model, {"name": version.model, "versions": [], "aliases": []})
            entry["versions"].append({
                "version": version.version, "location": version.location, "total_bytes": version.total_bytes,
                "fingerprint": version.fingerprint, "fingerprint_parts": dict(version.fingerprint_parts or {}),
                "registered_at": version.registered_at, "registered_by": version.registered_by,
                "last_verified_at": version.last_verified_at, "last_verify_healthy": version.last_verify_healthy,
                "last_verify_location": version.last_verify_location,
                "issues": sorted(version.issues, key=lambda i: i.id),
            })
        for model, entry in models.items():
            for alias in catalog_aliases.list_aliases(session, model=model):
                moves = list(catalog_aliases.alias_history(session, model=model, name=alias.name))
                ids = {alias.version_id} | {m.to_version_id for m in moves} | {
                    m.from_version_id for m in moves if m.from_version_id}
                labels = catalog_repository.version_labels(session, ids)
                entry["aliases"].append({
                    "name": alias.name, "version": labels[alias.version_id], "revision": alias.revision,
                    "updated_at": alias.updated_at,
                    "history": [{"action": m.action, "from": labels.get(m.from_version_id) if m.from_version_id
                                 else None, "to": labels[m.to_version_id], "revision": m.revision,
                                 "forced": m.forced, "actor": m.actor, "reason": m.reason, "at": m.moved_at,
                                 "event_id": m.event_id} for m in moves],
                })
    return {"models": sorted(models.values(), key=lambda m: m["name"])}


@router.get("/console/catalog", include_in_schema=False, name="console.catalog")
def catalog(request: Request) -> Response:
    user = current_user(request)
    if user is None:
        return to_sign_in(request)
    return render(request, "catalog.jinja", user=user, section="catalog", **catalog_view(request))


@router.post("/console/catalog/{model}/promote", include_in_schema=False, name="console.catalog_promote")
def catalog_promote(model: NamePath, request: Request, form: Form) -> Response:
    """Move an alias through `weight_catalog.aliases.promote`: the same refusals (fingerprint, critical issue,
    failed verify) and the same event and snapshot bump as POST /api/v1/catalog/…/promote."""
    checked = guard_action(request, form, Role.OPERATOR)
    if not isinstance(checked, console_session.ConsoleUser):
        return checked
    user = checked

    def act() -> Response:
        with unit_of_work(request) as session:
            body = parse(PromoteRequest, {"version": form.get("version", "").strip(),
                                          "reason": form.get("reason", "").strip(), "force": form.get("force") == "on"})
            alias = parse(AliasForm, {"alias": form.get("alias", "").strip()}).alias
            catalog_aliases.promote(session, model=model, alias=alias, version=body.version, actor=user.actor,
                                    reason=body.reason, force=body.force, clock=request.app.state.clock)
        return redirect(f"/console/catalog#model-{model}")

    return run_action(request, user, act, back="/console/catalog")


@router.post("/console/catalog/{model}/aliases/{alias}/rollback", include_in_schema=False,
             name="console.catalog_rollback")
def catalog_rollback(model: NamePath, alias: NamePath, request: Request, form: Form) -> Response:
    checked = guard_action(request, form, Role.OPERATOR)
    if not isinstance(checked, console_session.ConsoleUser):
        return checked
    user = checked

    def act() -> Response:
        with unit_of_work(request) as session:
            body = parse(CatalogRollback, {"reason": form.get("reason", "")})
            catalog_aliases.rollback(session, model=model, alias=alias, actor=user.actor, reason=body.reason,
                                     clock=request.app.state.clock)
        return redirect(f"/console/catalog#model-{model}")

    return run_action(request, user, act, back="/console/catalog")


__all__ = ["router"]
