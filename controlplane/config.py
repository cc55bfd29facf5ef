"""Settings of the control-plane process, read once at start-up.

Every key has the `LIFELINE_CONTROLPLANE_` prefix (`LIFELINE_CONTROLPLANE_DATABASE_URL`,
`LIFELINE_CONTROLPLANE_DATA_DIR`, ...). A bad value stops start-up with pydantic's
message, which names the key.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from controlplane.db import DatabaseTimeouts


class ControlPlaneSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LIFELINE_CONTROLPLANE_", extra="ignore")

    # Embedded default: one SQLite file under the data directory. Production
    # sets a postgresql+psycopg:// URL.
    data_dir: Path = Path(".lifeline")
    database_url: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8400, ge=1, le=65535)
    log_level: str = "info"
    # Redis holding the regions' lease registries; unset means no registry
    # is read and every region reports no observed instances.
    lease_redis_url: str | None = None
    # Keys are {lease_key_prefix}:{region}:… (contract.lease), as the gateways' registry.key_prefix.
    lease_key_prefix: str = "lifeline"
    # How long a gateway may cache a snapshot before it asks again.
    snapshot_max_age: timedelta = timedelta(seconds=5)
    # Request bodies over this are refused with 413 request_too_large.
    max_request_bytes: int = Field(default=8 * 1024 * 1024, ge=64 * 1024)
    # A gateway report received longer ago than this is shown as stale.
    gateway_report_stale_after: timedelta = timedelta(seconds=30)
    # A regional agent's report received longer ago than this is shown as stale (agents report every second).
    agent_report_stale_after: timedelta = timedelta(seconds=15)
    # Block size and parallelism for shard hashing in the weight catalog.
    hash_block_bytes: int = Field(default=8 * 1024 * 1024, ge=64 * 1024)
    hash_workers: int = Field(default=4, ge=1, le=64)
    s3_endpoint_url: str | None = None
    # Directories the API may read artifacts from (JSON list in the env).
    # The CLI reads any path its user can; the API refuses paths outside
    # these roots, so a token cannot make the server hash /etc.
    artifact_roots: list[Path] = []

    # A database that is down or silent answers 503 database_unavailable
    # after at most these (see controlplane.db.DatabaseTimeouts).
    database_connect_timeout: timedelta = timedelta(seconds=5)
    database_statement_timeout: timedelta = timedelta(seconds=30)
    database_pool_timeout: timedelta = timedelta(seconds=10)

    # Celery broker: amqp://guest:guest@127.0.0.1:5672// (RabbitMQ) or redis://…;
    # unset runs tasks in-process (the embedded default). See controlplane/celery_app.py.
    celery_broker_url: str | None = None
    # How often beat asks which drills are due (their cadence is per scope: weekly, monthly, quarterly).
    drill_cadence_check: timedelta = timedelta(hours=1)
    # The fleet a scheduled drill acts on (controlplane/drill/fleet.py); unset: runs wait to be run by hand.
    drill_fleet_file: Path | None = None
    # Where drill reports (Markdown, JSON, timeline PNG) are written; unset: the database only.
    drill_report_dir: Path | None = None
    # The routing systems cutovers drive besides the snapshot (HAProxy, ExaBGP/BIRD, BIND9 or Route 53,
    # Istio): a TOML file, cutover/drivers_file.py. Unset: those tiers are recorded only.
    cutover_drivers_file: Path | None = None
    # Which Alertmanager alerts may act (a fault report, a drill run, an event): a TOML file,
    # controlplane/alerts/routes.py. Unset: the receiver refuses every delivery.
    alert_routes_file: Path | None = None
    # Where deploy/monitoring's Grafana dashboards are served (https://grafana.example): the console links each
    # cutover and drill run to its panel over the window it ran in. Unset: no such links.
    grafana_url: str | None = Field(None, pattern=r"^https?://[^\s\"'<>]+$")

    def database_timeouts(self) -> DatabaseTimeouts:
        from controlplane.db import DatabaseTimeouts

        return DatabaseTimeouts(connect=self.database_connect_timeout, statement=self.database_statement_timeout,
                                pool=self.database_pool_timeout)

    @field_validator("database_url")
    @classmethod
    def _known_scheme(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("sqlite", "postgresql")):
            raise ValueError("LIFELINE_CONTROLPLANE_DATABASE_URL must be a sqlite:// or postgresql:// URL")
        if value.startswith("postgresql://"):
            # psycopg 3 is the installed driver; the bare scheme means psycopg2.
            value = "postgresql+psycopg://" + value.removeprefix("postgresql://")
        return value

    def resolved_database_url(self) -> str:
        if self.database_url is not None:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'controlplane.sqlite3').resolve()}"
