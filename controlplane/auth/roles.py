from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    def allows(self, required: Role) -> bool:
        order = [Role.VIEWER, Role.OPERATOR, Role.ADMIN]
        return order.index(self) >= order.index(required)
