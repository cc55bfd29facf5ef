"""Alertmanager's webhook payload (version 4) and what the receiver answers.

Unknown fields are ignored: Alertmanager adds fields between releases, and a
receiver that refused them would stop paging on an upgrade. What the
receiver reads is checked: a delivery it cannot read is a 422 and changes
nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Alert(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(max_length=200)
    annotations: dict[str, str] = Field(default_factory=dict, max_length=200)
    startsAt: datetime  # noqa: N815 - Alertmanager's names
    endsAt: datetime | None = None  # noqa: N815
    generatorURL: str = Field("", max_length=4000)  # noqa: N815
    fingerprint: str = Field(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$")

    def key(self) -> str:
        """The same alert, the same key, however often it is delivered; its resolution is another."""
        return f"{self.fingerprint}@{self.startsAt.isoformat()}/{self.status}"


class AlertmanagerWebhook(BaseModel):
    model_config = ConfigDict(extra="ignore")

    version: Literal["4"]
    receiver: str = Field(min_length=1, max_length=200)
    status: Literal["firing", "resolved"]
    alerts: list[Alert] = Field(min_length=1, max_length=1000)
    groupKey: str = Field("", max_length=4000)  # noqa: N815
    externalURL: str = Field("", max_length=4000)  # noqa: N815


class AlertResult(BaseModel):
    fingerprint: str
    alertname: str
    status: str
    action: str
    outcome: str  # escalated | drill_requested | recorded | unrouted | duplicate | in_progress | failed
    detail: dict[str, Any] = Field(default_factory=dict)


class WebhookResult(BaseModel):
    alerts: list[AlertResult]
