"""Imports every table module so `Base.metadata` is complete (Alembic, tests)."""

from __future__ import annotations

from controlplane.auth import models as auth_models
from controlplane.db import Base
from controlplane.event import models as event_models
from controlplane.snapshot import models as snapshot_models
from controlplane.topology import models as topology_models
from weight_catalog import models as catalog_models

__all__ = ["Base", "auth_models", "catalog_models", "event_models", "snapshot_models", "topology_models"]
