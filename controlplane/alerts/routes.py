"""Which Alertmanager alerts may act on Lifeline, and how: a TOML file read once at start-up.

`LIFELINE_CONTROLPLANE_ALERT_ROUTES_FILE` names it; unset, the receiver
refuses every delivery (`alerts_not_configured`), so nothing acts on alerts
by accident.

    [source]
    receiver = "lifeline"                # Alertmanager's receiver name: a delivery naming another is refused

    [[route]]                            # the first route whose alertname and labels match acts
    alertname = "LifelineZoneUnserved"
    match = {severity = "page"}          # optional: labels that must equal these
    action = "fault"                     # fault | drill | event
    scope = "zone"                       # fault: instance | zone | region, named by the labels below
    region_label = "region"              # defaults: region, zone, instance_id
    zone_label = "zone"

    [[route]]
    alertname = "LifelineDrillOverdue"
    action = "drill"
    drill = "weekly-kill"                # drill: the definition (its latest version) a run is requested of

    fault   the alert becomes a fault report to the escalation ladder (the same
            ladder, safety rules and evidence as the regional agent's reports)
    drill   a run of the named drill is requested, as an operator's would be
            (zone and region runs still wait for a person's approval)
    event   one `alert.received` event, nothing else

An alert no route matches is recorded (`alert.received`, outcome `unrouted`)
and acts on nothing. A bad file stops `lifeline controlplane serve` naming
the file and the key.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from controlplane.types import Name


class AlertRoutesError(Exception):
    """The alert routes file cannot be used; the message names the file and the key."""


class AlertSource(BaseModel):
    model_config = ConfigDict(extra="forbid")

    receiver: str = Field(min_length=1, max_length=200)


class AlertRoute(BaseModel):
    model_config = ConfigDict(extra="forbid")

    alertname: str = Field(min_length=1, max_length=200)
    match: dict[str, str] = Field(default_factory=dict)
    action: Literal["fault", "drill", "event"]
    scope: Literal["instance", "zone", "region"] | None = None
    drill: Name | None = None
    region_label: str = "region"
    zone_label: str = "zone"
    instance_label: str = "instance_id"

    @model_validator(mode="after")
    def _complete(self) -> AlertRoute:
        if self.action == "fault" and self.scope is None:
            raise ValueError("a fault route names its scope: instance, zone or region")
        if self.action == "drill" and self.drill is None:
            raise ValueError("a drill route names the drill it requests a run of")
        if self.action != "fault" and self.scope is not None:
            raise ValueError(f"scope: only a fault route has one, not a {self.action} route")
        if self.action != "drill" and self.drill is not None:
            raise ValueError(f"drill: only a drill route names one, not a {self.action} route")
        return self

    def matches(self, labels: dict[str, str]) -> bool:
        return labels.get("alertname") == self.alertname and all(labels.get(k) == v for k, v in self.match.items())


class AlertRoutes(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: AlertSource
    route: list[AlertRoute] = Field(default_factory=list, max_length=1000)

    def route_for(self, labels: dict[str, str]) -> AlertRoute | None:
        return next((r for r in self.route if r.matches(labels)), None)


def load(path: Path) -> AlertRoutes:
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise AlertRoutesError(f"{path}: {error}") from None
    try:
        return AlertRoutes.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise AlertRoutesError(f"{path}: {key}: {first['msg']}") from None
