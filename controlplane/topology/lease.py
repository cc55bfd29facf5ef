"""Reading a region's lease registry (read-only; never on the renewal path).

The gateway owns the registry and renews leases; the control plane only
reads it to show observed instances. Key schema, one key per instance:

    lifeline:lease:{region}:{instance_id}

holding either a Redis hash or a JSON string with the fields
`instance_id, generation, endpoint, zone, state, lease_expires_at`
(`lease_expires_at` as ISO-8601 with offset, or Unix seconds). Liveness is
computed at read time from `lease_expires_at` and the injected clock; it is
never stored.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from lifeline.logs import get_logger

log = get_logger(__name__)

KEY_PREFIX = "lifeline:lease:"


def lease_key(region: str, instance_id: str) -> str:
    return f"{KEY_PREFIX}{region}:{instance_id}"


@dataclass(frozen=True)
class ObservedInstance:
    instance_id: str
    generation: int
    endpoint: str
    zone: str | None
    state: str
    lease_expires_at: datetime

    def is_live(self, now: datetime) -> bool:
        return now < self.lease_expires_at


class LeaseReader(Protocol):
    def list_instances(self, region: str) -> list[ObservedInstance]: ...


def parse_instance(fields: Mapping[str, Any]) -> ObservedInstance:
    """Build an instance from registry fields; raises ValueError on a malformed record."""
    expires = fields["lease_expires_at"]
    if isinstance(expires, int | float) or (isinstance(expires, str) and expires.replace(".", "", 1).isdigit()):
        expires_at = datetime.fromtimestamp(float(expires), UTC)
    else:
        expires_at = datetime.fromisoformat(str(expires))
        if expires_at.tzinfo is None:
            raise ValueError("lease_expires_at needs a UTC offset")
    return ObservedInstance(
        instance_id=str(fields["instance_id"]),
        generation=int(fields["generation"]),
        endpoint=str(fields["endpoint"]),
        zone=(str(fields["zone"]) or None) if fields.get("zone") is not None else None,
        state=str(fields["state"]),
        lease_expires_at=expires_at,
    )


class InMemoryLeaseReader:
    """For tests and the embedded mode: instances put here by hand."""

    def __init__(self, instances: Iterable[tuple[str, ObservedInstance]] = ()) -> None:
        self._by_region: dict[str, dict[str, ObservedInstance]] = {}
        for region, instance in instances:
            self.put(region, instance)

    def put(self, region: str, instance: ObservedInstance) -> None:
        self._by_region.setdefault(region, {})[instance.instance_id] = instance

    def remove(self, region: str, instance_id: str) -> None:
        self._by_region.get(region, {}).pop(instance_id, None)

    def list_instances(self, region: str) -> list[ObservedInstance]:
        return sorted(self._by_region.get(region, {}).values(), key=lambda i: i.instance_id)


class RedisLeaseReader:
    """Reads the key schema above with SCAN; tolerates both hash and JSON values."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def list_instances(self, region: str) -> list[ObservedInstance]:
        pattern = f"{KEY_PREFIX}{_escape_glob(region)}:*"
        instances = []
        for raw_key in self._client.scan_iter(match=pattern, count=500):
            key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            record = self._read(key)
            if record is None:
                continue
            try:
                instances.append(parse_instance(record))
            except (KeyError, ValueError, TypeError) as exc:
                log.warning("lease_record_malformed", key=key, error=str(exc))
        return sorted(instances, key=lambda i: i.instance_id)

    def _read(self, key: str) -> dict[str, Any] | None:
        kind = _text(self._client.type(key))
        if kind == "hash":
            return {_text(k): _text(v) for k, v in self._client.hgetall(key).items()}
        if kind == "string":
            raw = self._client.get(key)
            if raw is None:
                return None
            try:
                value = json.loads(raw)
            except ValueError:
                log.warning("lease_record_malformed", key=key, error="not JSON")
                return None
            return value if isinstance(value, dict) else None
        return None  # expired between SCAN and read, or an unrelated type


class NoLeaseRegistry:
    """No registry configured: every region observes nothing."""

    def list_instances(self, region: str) -> list[ObservedInstance]:
        return []


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _escape_glob(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
