"""Composition root of the database schema: every domain's tables, and the migrations that build them.

`metadata()` imports each domain's `models` so `Base.metadata` is complete
(Alembic's env, the test cleaner); `upgrade`/`downgrade` run the Alembic
scripts in `migrations/`, found through the package path, so `lifeline
controlplane migrate` works from any directory. Nothing below the root
imports this module: domains define tables, they never list them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import MetaData

from controlplane.db import Base


def metadata() -> MetaData:
    from controlplane.agent_report import models as agent_report_models  # noqa: F401
    from controlplane.alerts import models as alerts_models  # noqa: F401
    from controlplane.auth import models as auth_models  # noqa: F401
    from controlplane.drill import models as drill_models  # noqa: F401
    from controlplane.event import models as event_models  # noqa: F401
    from controlplane.gateway_report import models as gateway_report_models  # noqa: F401
    from controlplane.mesh_route import models as mesh_route_models  # noqa: F401
    from controlplane.replication import models as replication_models  # noqa: F401
    from controlplane.routing_version import models as routing_version_models  # noqa: F401
    from controlplane.topology import models as topology_models  # noqa: F401
    from cutover import models as cutover_models  # noqa: F401
    from weight_catalog import models as catalog_models  # noqa: F401

    return Base.metadata


def alembic_config(url: str) -> Any:
    """Alembic config found through the package path, so `migrate` works from any cwd."""
    from alembic.config import Config

    import migrations

    # __path__, not __file__: an editable install made before migrations/ had
    # an __init__.py maps it as a namespace package, which has no __file__.
    script_dir = Path(next(iter(migrations.__path__)))
    config = Config()
    config.set_main_option("script_location", str(script_dir))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    config.attributes["configure_logging"] = False
    return config


def upgrade(url: str, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)
