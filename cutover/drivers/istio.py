"""The mesh tier on Istio: the weights of one `VirtualService` HTTP route, through the `kubernetes` client.

A zone's (or a version's) share of a route is moved by rewriting the
`weight` of its destinations in `spec.http[name=route].route[]`; the
route's other destinations take up the share, so the weights keep their
total (Istio's API reference: they should sum to 100). Envoy applies a
pushed route change without dropping connections, hence "sub-second".

    read      GET  …/virtualservices/{name}   weights of the route + istiod's status
    write     GET, change the weights, PUT with the resourceVersion read:
              optimistic concurrency; a 409 Conflict (someone else wrote
              between the two) re-reads and re-applies, up to `conflict_retries`
    verify    the spec shows the weights *and* istiod reports that
              generation reconciled (`status.observedGeneration` equals
              `metadata.generation`, condition `Reconciled` True; istiod
              writes them with `PILOT_ENABLE_STATUS`): a spec nobody
              pushed to the proxies is not in effect. `require_reconciled=False`
              verifies the spec alone, and the evidence says so.

A destination is named `host` or `host/subset` (the DestinationRule
subset, e.g. one per zone or per version). The write never adds or drops
destinations: a desired state that names other destinations than the
route has is refused (`DriverRejected`), as is a route that does not exist.

Errors: connection failures and 5xx are `DriverUnavailable` (retried);
404, 403, 422 and the like are `DriverRejected`; conflicts that outlast
the retries are `DriverUnavailable` (someone keeps writing: try again).
Tested against `lifeline.kube_emulator` (no API server runs here).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes.client import ApiClient, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from common.clock import Clock
from contract.routing_tier import RoutingTier
from cutover.drivers.base import DriverRejected, DriverUnavailable, MeshState, MeshTarget
from cutover.drivers.polling import PollingDriver, retry_unavailable

GROUP = "networking.istio.io"
PLURAL = "virtualservices"


def destination_key(destination: dict[str, Any]) -> str:
    """`host` or `host/subset`: how a route's destination is named in a MeshState."""
    dest = destination.get("destination") or {}
    subset = dest.get("subset")
    return f"{dest.get('host')}/{subset}" if subset else str(dest.get("host"))


def route_weights(route: dict[str, Any]) -> dict[str, int]:
    """The weight of each destination; a lone destination without one takes everything (Istio's default)."""
    destinations = route.get("route") or []
    default = 100 if len(destinations) == 1 else 0
    return {destination_key(d): int(d.get("weight", default)) for d in destinations}


def reconciled(obj: dict[str, Any]) -> bool:
    status = obj.get("status") or {}
    if status.get("observedGeneration") != obj["metadata"].get("generation"):
        return False
    return any(c.get("type") == "Reconciled" and c.get("status") == "True" for c in status.get("conditions") or [])


class IstioVirtualServiceDriver(PollingDriver[MeshState]):
    tier = RoutingTier.MESH
    poll_interval_s = 0.01

    def __init__(self, api_client: ApiClient, *, api_version: str = "v1", require_reconciled: bool = True,
                 conflict_retries: int = 5, request_timeout_s: tuple[float, float] = (2.0, 5.0),
                 clock: Clock | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(clock=clock, sleep=sleep)
        self.api = CustomObjectsApi(api_client)
        self.api_version = api_version
        self.require_reconciled = require_reconciled
        self.conflict_retries = conflict_retries
        self.request_timeout_s = request_timeout_s

    # -- the API server
    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(GROUP, self.api_version, *args, _request_timeout=self.request_timeout_s, **kwargs)
        except ApiException as exc:
            if exc.status == 409:
                raise
            message = f"kubernetes API: {what}: {exc.status} {exc.reason}: {(exc.body or '')[:300]}"
            if exc.status == 0 or exc.status >= 500 or exc.status == 429:
                raise DriverUnavailable(message) from exc
            raise DriverRejected(message) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise DriverUnavailable(f"kubernetes API unreachable: {what}: {exc!r}"[:500]) from exc

    def _get(self, target: MeshTarget) -> dict[str, Any]:
        return self._call(f"get virtualservice {target.namespace}/{target.virtual_service}",
                          self.api.get_namespaced_custom_object, target.namespace, PLURAL, target.virtual_service)

    @staticmethod
    def _route(obj: dict[str, Any], target: MeshTarget) -> dict[str, Any]:
        for route in (obj.get("spec") or {}).get("http") or []:
            if route.get("name") == target.route:
                return route
        names = [r.get("name") for r in (obj.get("spec") or {}).get("http") or []]
        raise DriverRejected(f"virtualservice {target.namespace}/{target.virtual_service} has no http route "
                             f"{target.route!r} (routes: {names})")

    # -- PollingDriver
    @retry_unavailable()
    def observe(self, target: MeshTarget) -> tuple[MeshState, str]:  # type: ignore[override]
        obj = self._get(target)
        weights = route_weights(self._route(obj, target))
        is_reconciled = reconciled(obj) if self.require_reconciled else True
        status = obj.get("status") or {}
        evidence = (f"virtualservice {target.namespace}/{target.virtual_service} route {target.route}: "
                    + ", ".join(f"{k}={v}" for k, v in sorted(weights.items()))
                    + f"; resourceVersion={obj['metadata'].get('resourceVersion')} "
                      f"generation={obj['metadata'].get('generation')} "
                      f"observedGeneration={status.get('observedGeneration')}"
                    + ("" if self.require_reconciled else " (istiod status not required: spec only)"))
        return MeshState(target=target, weights=weights, reconciled=is_reconciled), evidence

    @retry_unavailable()
    def _write(self, desired: MeshState) -> None:  # type: ignore[override]
        target = desired.target
        for _ in range(self.conflict_retries + 1):
            obj = self._get(target)
            route = self._route(obj, target)
            if set(route_weights(route)) != set(desired.weights):
                raise DriverRejected(f"route {target.route!r} has destinations {sorted(route_weights(route))}, "
                                     f"the change names {sorted(desired.weights)}")
            if route_weights(route) == desired.weights:
                return  # idempotent: nothing to write
            body = copy.deepcopy(obj)
            for destination in self._route(body, target)["route"]:
                destination["weight"] = desired.weights[destination_key(destination)]
            body.pop("status", None)
            try:
                self._call(f"replace virtualservice {target.namespace}/{target.virtual_service}",
                           self.api.replace_namespaced_custom_object, target.namespace, PLURAL,
                           target.virtual_service, body)
                return
            except ApiException:  # 409: another writer since our read; read again and re-apply
                continue
        raise DriverUnavailable(f"virtualservice {target.namespace}/{target.virtual_service} kept changing under "
                                f"the write ({self.conflict_retries + 1} conflicts)")
