"""An emulator of the few Kubernetes API calls Lifeline's drivers make, on loopback HTTP.

No Kubernetes API server can run on these machines, so the drivers' tests
(`tests/integration/warm_pool/test_kubernetes_driver_emulator.py`, the
warm-pool driver; `tests/integration/cutover/test_istio_driver_emulator.py`,
the mesh tier's Istio driver) point the real `kubernetes` client at this
instead. It emulates exactly these calls, with the semantics the drivers
depend on, and nothing else (a call outside the list answers 404 with the
path, so a new call in a driver fails loudly):

    GET    /apis/apps/v1/namespaces/{ns}/deployments/{name}     200 | 404
    POST   /apis/apps/v1/namespaces/{ns}/deployments            201 | 409 AlreadyExists
    PUT    /apis/apps/v1/namespaces/{ns}/deployments/{name}     200 | 409 Conflict (stale resourceVersion)
    GET    /api/v1/namespaces/{ns}/pods?labelSelector=k=v,…     PodList (equality selectors only)
    GET    /api/v1/namespaces/{ns}/pods?watch=1&resourceVersion=N&timeoutSeconds=T
                                                                a watch: ADDED / MODIFIED / DELETED events after
                                                                N, one JSON object a line, chunked, until T;
                                                                410 Gone (an ERROR event) when N is compacted
    PATCH  /api/v1/namespaces/{ns}/pods/{name}                  strategic merge of metadata; a resourceVersion
                                                                in the body is a precondition (409 if stale)
    DELETE /api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=N
    GET    /apis/networking.istio.io/{v1|v1beta1}/namespaces/{ns}/virtualservices/{name}   200 | 404
    PUT    /apis/networking.istio.io/{v1|v1beta1}/namespaces/{ns}/virtualservices/{name}   200 | 409 Conflict
                                                                (stale resourceVersion) | 422 Invalid

Behaviour emulated, and its source in Kubernetes:
- one resourceVersion counter for every write (etcd's revision); a write
  carrying an older one is a 409 `Conflict`, as the API server answers;
- `interfere(n)`: another writer (kubectl, an autoscaler) changes the
  Deployment just before each of the next n writes land, so the driver's
  read-modify-write conflicts for real;
- the ReplicaSet controller, run synchronously after each Deployment write
  and pod deletion: it creates pods up to `spec.replicas` and, scaling down,
  deletes in the controller's order (not ready before ready, lower
  `controller.kubernetes.io/pod-deletion-cost` first, newest first). Pods
  being deleted gracefully keep a `deletionTimestamp` until
  `finish_terminations()` and no longer count toward the replicas, so the
  controller replaces them at once, as it does;
- watches on pods, as the API server streams them: every change to a pod
  is an event with the pod's new resourceVersion (a deletion too), kept in
  a log a watch replays from its `resourceVersion`; `expire_watches()` is
  etcd's compaction: open watches end and a watch from before it gets an
  ERROR event with a 410 `Expired` Status, so the client must list again;
- pods start Running with an IP and not Ready; `set_ready()` is the kubelet's
  readiness probe passing; `kill_pod()` is a node lost;
- every body received is validated by `kubernetes_validate` (strict) for
  the targeted Kubernetes version and refused with 422 `Invalid` when it
  fails, as the API server refuses an object its schema rejects;
- VirtualServices (a custom resource: `kubernetes_validate` has no schema
  for it) are checked by `_check_virtual_service`: `spec.http[]` routes
  with names, destinations with a host, integer weights 0–100 that sum to
  100 when a route has several (Istio's API reference: "Sum of weights
  across destinations SHOULD BE == 100"); a spec change bumps
  `metadata.generation`, as the API server does for custom resources;
- istiod's status reporting (`PILOT_ENABLE_STATUS`): after each spec
  change it writes `status.observedGeneration` and a `Reconciled`
  condition — itself a write that bumps the resourceVersion — unless
  `pause_istiod()` holds it (proxies not acknowledging the push);
  `interfere_virtual_service(n)` is another writer landing before each of
  the next n PUTs.

Not emulated: watches of other kinds, bookmarks, field selectors, set-based label selectors,
server-side apply, JSON patch, admission, scheduling.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"

_DEPLOYMENTS = re.compile(r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/deployments(?:/(?P<name>[^/]+))?$")
_PODS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+))?$")
_VIRTUAL_SERVICES = re.compile(
    r"^/apis/networking\.istio\.io/(?P<version>v1|v1beta1)/namespaces/(?P<ns>[^/]+)/virtualservices/(?P<name>[^/]+)$")


class _Refused(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


@dataclass
class EmulatedRequest:
    method: str
    path: str
    status: int
    body: dict[str, Any] | None = None


@dataclass
class KubeApiEmulator:
    """Start with `with KubeApiEmulator() as api:`; point a client at `api.url`."""

    kubernetes_version: str = "1.33.0"
    requests: list[EmulatedRequest] = field(default_factory=list)
    deployments: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    deleted: list[tuple[str, int | None]] = field(default_factory=list)  # (pod, gracePeriodSeconds asked for)
    virtual_services: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._revision = itertools.count(1)
        self._pod_seq = itertools.count(1)
        self._interference: list[Callable[[dict[str, Any]], None]] = []
        self._vs_interference: list[Callable[[dict[str, Any]], None]] = []
        self._istiod_paused = False
        self._server: ThreadingHTTPServer | None = None
        self._changed = threading.Condition(self._lock)  # a pod event was logged, or watches expired
        self._pod_events: list[tuple[int, str, str, dict[str, Any]]] = []  # (rv, type, namespace, pod as served)
        self._compacted_to = 0  # a watch from a resourceVersion below this gets 410 Gone
        self._watch_epoch = 0  # bumped by expire_watches(): open watches end
        self._latest = 0  # the last resourceVersion written (a list is consistent as of it)
        self.watches = 0  # watch requests served
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None, "start the emulator first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> KubeApiEmulator:
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes; with Nagle on, the second waits for the client's
            # delayed ACK (~40 ms on Linux) on a kept-alive connection — a cost no API server has.
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:  # the test's own log says enough
                return

            def _handle(self) -> None:
                emulator._serve(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="kube-api-emulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._watch_epoch += 1
            self._changed.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> KubeApiEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what a test does to the cluster ------------------------------------------------------------
    def interfere(self, times: int, change: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Another writer changes the Deployment just before each of the next `times` writes lands."""
        with self._lock:
            self._interference.extend([change or _annotate_by_someone_else] * times)

    def set_ready(self, pod_name: str, ready: bool = True, namespace: str = "default") -> None:
        with self._lock:
            pod = self.pods[(namespace, pod_name)]
            pod["status"]["conditions"] = [_condition("Ready", ready), _condition("ContainersReady", ready)]
            self._bump(pod)
            self._pod_event("MODIFIED", pod)

    def kill_pod(self, pod_name: str, namespace: str = "default") -> None:
        """The node is gone: the pod vanishes without a grace period, and its ReplicaSet replaces it."""
        with self._lock:
            pod = self.pods.pop((namespace, pod_name))
            self._pod_event("DELETED", pod)
            owner = pod["metadata"]["labels"].get("_owner")
            self._reconcile_owner(namespace, owner)

    def finish_terminations(self) -> None:
        """Every pod being deleted gracefully has exited."""
        with self._lock:
            for key in [k for k, pod in self.pods.items() if pod["metadata"].get("deletionTimestamp")]:
                self._pod_event("DELETED", self.pods.pop(key))

    def expire_watches(self) -> None:
        """etcd compacted its history: open watches end, and one resumed from before now is 410 Gone."""
        with self._lock:
            self._latest = self._compacted_to = next(self._revision)  # etcd's compaction is a revision too
            self._pod_events.clear()
            self._watch_epoch += 1
            self._changed.notify_all()

    def pods_of(self, deployment: str, namespace: str = "default") -> list[dict[str, Any]]:
        with self._lock:
            return [_public(p) for (ns, _), p in sorted(self.pods.items())
                    if ns == namespace and p["metadata"]["labels"].get("_owner") == deployment]

    def add_virtual_service(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a VirtualService as `kubectl apply` would (the driver only reads and replaces them)."""
        with self._lock:
            _check_virtual_service(body)
            stored = copy.deepcopy(body)
            ns = stored["metadata"].setdefault("namespace", "default")
            name = stored["metadata"]["name"]
            stored["metadata"].update(generation=1, creationTimestamp=_now(), uid=_uid(ns, name))
            self._bump(stored)
            self.virtual_services[(ns, name)] = stored
            self._istiod_reconcile(stored)
            return _public(stored)

    def virtual_service(self, name: str, namespace: str = "default") -> dict[str, Any]:
        with self._lock:
            return _public(self.virtual_services[(namespace, name)])

    def interfere_virtual_service(self, times: int, change: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Another writer changes the VirtualService just before each of the next `times` PUTs lands."""
        with self._lock:
            self._vs_interference.extend([change or _annotate_by_someone_else] * times)

    def pause_istiod(self) -> None:
        """istiod stops reporting: specs change, `status.observedGeneration` stays behind."""
        with self._lock:
            self._istiod_paused = True

    def resume_istiod(self) -> None:
        with self._lock:
            self._istiod_paused = False
            for stored in self.virtual_services.values():
                self._istiod_reconcile(stored)

    def writes(self, method: str | None = None) -> list[EmulatedRequest]:
        return [r for r in self.requests if r.method != "GET" and (method is None or r.method == method)]

    # -- HTTP ---------------------------------------------------------------------------------------
    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(handler.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if handler.command == "GET" and query.get("watch") in ("1", "true", "True") and \
                (match := _PODS.match(parts.path)) and match["name"] is None:
            self._serve_watch(handler, match["ns"], query)
            return
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        try:
            with self._lock:
                status, answer = self._route(handler.command, parts.path, query, body)
        except _Refused as refused:
            status, answer = refused.code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                            "message": refused.message, "reason": refused.reason, "code": refused.code}
        with self._lock:
            self.requests.append(EmulatedRequest(handler.command, parts.path, status, body))
        data = json.dumps(answer).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _route(self, method: str, path: str, query: dict[str, str],
               body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        if match := _DEPLOYMENTS.match(path):
            ns, name = match["ns"], match["name"]
            if method == "POST" and name is None:
                return HTTPStatus.CREATED, self._create_deployment(ns, self._validated(body))
            if method == "GET" and name is not None:
                return HTTPStatus.OK, _public(self._deployment(ns, name))
            if method == "PUT" and name is not None:
                return HTTPStatus.OK, self._replace_deployment(ns, name, self._validated(body))
        if match := _PODS.match(path):
            ns, name = match["ns"], match["name"]
            if method == "GET" and name is None:
                return HTTPStatus.OK, self._list_pods(ns, query.get("labelSelector", ""))
            if method == "PATCH" and name is not None:
                return HTTPStatus.OK, self._patch_pod(ns, name, self._validated(body))
            if method == "DELETE" and name is not None:
                grace = query.get("gracePeriodSeconds")
                return HTTPStatus.OK, self._delete_pod(ns, name, None if grace is None else int(grace))
        if match := _VIRTUAL_SERVICES.match(path):
            ns, name = match["ns"], match["name"]
            if method == "GET":
                return HTTPStatus.OK, _public(self._virtual_service(ns, name))
            if method == "PUT":
                return HTTPStatus.OK, self._replace_virtual_service(ns, name, body)
        raise _Refused(404, "NotFound", f"the emulator does not serve {method} {path}")

    def _validated(self, body: dict[str, Any] | None) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise _Refused(400, "BadRequest", "a JSON object is required")
        try:
            kubernetes_validate.validate(body, self.kubernetes_version, strict=True)
        except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as exc:
            raise _Refused(422, "Invalid", f"{body.get('kind')} is invalid: {str(exc).splitlines()[0]}") from None
        return body

    # -- deployments and their ReplicaSet ----------------------------------------------------------
    def _deployment(self, ns: str, name: str) -> dict[str, Any]:
        try:
            return self.deployments[(ns, name)]
        except KeyError:
            raise _Refused(404, "NotFound", f'deployments.apps "{name}" not found') from None

    def _create_deployment(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        if (ns, name) in self.deployments:
            raise _Refused(409, "AlreadyExists", f'deployments.apps "{name}" already exists')
        stored = copy.deepcopy(body)
        stored["metadata"].update(namespace=ns, generation=1, creationTimestamp=_now(), uid=_uid(ns, name))
        stored["metadata"].pop("resourceVersion", None)
        self._bump(stored)
        self.deployments[(ns, name)] = stored
        self._reconcile(ns, stored)
        return _public(stored)

    def _replace_deployment(self, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        stored = self._deployment(ns, name)
        if self._interference:
            self._interference.pop(0)(stored)
            self._bump(stored)
        sent = body["metadata"].get("resourceVersion")
        if sent is not None and sent != stored["metadata"]["resourceVersion"]:
            raise _Refused(409, "Conflict", f'Operation cannot be fulfilled on deployments.apps "{name}": the object '
                                            "has been modified; please apply your changes to the latest version and try again")
        replaced = copy.deepcopy(body)
        kept = {k: stored["metadata"][k] for k in ("namespace", "creationTimestamp", "uid", "generation")}
        replaced["metadata"].update(kept)
        if replaced.get("spec") != stored.get("spec"):
            replaced["metadata"]["generation"] = stored["metadata"]["generation"] + 1
        replaced["status"] = stored.get("status", {})
        self._bump(replaced)
        self.deployments[(ns, name)] = replaced
        self._reconcile(ns, replaced)
        return _public(replaced)

    def _reconcile_owner(self, ns: str, owner: str | None) -> None:
        if owner is not None and (ns, owner) in self.deployments:
            self._reconcile(ns, self.deployments[(ns, owner)])

    def _reconcile(self, ns: str, deployment: dict[str, Any]) -> None:
        """The ReplicaSet controller: pods up or down to `spec.replicas`, then the Deployment's status."""
        name = deployment["metadata"]["name"]
        template = deployment["spec"]["template"]
        template_hash = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
        mine = [(key, p) for key, p in self.pods.items() if key[0] == ns and p["metadata"]["labels"]["_owner"] == name]
        active = [(key, p) for key, p in mine if not p["metadata"].get("deletionTimestamp")]
        want = deployment["spec"].get("replicas", 1)
        for _ in range(want - len(active)):
            seq = next(self._pod_seq)
            pod_name = f"{name}-{template_hash}-{seq:05d}"
            labels = {**template["metadata"].get("labels", {}), "pod-template-hash": template_hash, "_owner": name}
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": pod_name, "namespace": ns, "labels": labels,
                                "annotations": dict(template["metadata"].get("annotations", {})),
                                "creationTimestamp": _now(), "uid": _uid(ns, pod_name)},
                   "spec": copy.deepcopy(template["spec"]),
                   "status": {"phase": "Running", "podIP": f"10.244.{seq // 250}.{seq % 250 + 1}",
                              "conditions": [_condition("Ready", False), _condition("ContainersReady", False)]}}
            pod["metadata"]["_seq"] = seq
            self._bump(pod)
            self.pods[(ns, pod_name)] = pod
            self._pod_event("ADDED", pod)
        if len(active) > want:
            for key, _ in sorted(active, key=_deletion_rank)[: len(active) - want]:
                self._pod_event("DELETED", self.pods.pop(key))
        replicas = [p for key, p in self.pods.items() if key[0] == ns and p["metadata"]["labels"]["_owner"] == name
                    and not p["metadata"].get("deletionTimestamp")]
        deployment["status"] = {"replicas": len(replicas), "readyReplicas": sum(_ready(p) for p in replicas),
                                "observedGeneration": deployment["metadata"]["generation"]}

    # -- Istio VirtualServices, and istiod's status -------------------------------------------------
    def _virtual_service(self, ns: str, name: str) -> dict[str, Any]:
        try:
            return self.virtual_services[(ns, name)]
        except KeyError:
            raise _Refused(404, "NotFound",
                           f'virtualservices.networking.istio.io "{name}" not found') from None

    def _replace_virtual_service(self, ns: str, name: str, body: dict[str, Any] | None) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise _Refused(400, "BadRequest", "a JSON object is required")
        try:
            _check_virtual_service(body)
        except ValueError as exc:
            raise _Refused(422, "Invalid", f"VirtualService.networking.istio.io {name!r} is invalid: {exc}") from None
        stored = self._virtual_service(ns, name)
        if self._vs_interference:
            self._vs_interference.pop(0)(stored)
            self._bump(stored)
        sent = body["metadata"].get("resourceVersion")
        if sent is not None and sent != stored["metadata"]["resourceVersion"]:
            raise _Refused(409, "Conflict", f'Operation cannot be fulfilled on virtualservices.networking.istio.io '
                                            f'"{name}": the object has been modified; please apply your changes to '
                                            "the latest version and try again")
        replaced = copy.deepcopy(body)
        kept = {k: stored["metadata"][k] for k in ("namespace", "creationTimestamp", "uid", "generation")}
        replaced["metadata"].update(kept)
        if replaced.get("spec") != stored.get("spec"):
            replaced["metadata"]["generation"] = stored["metadata"]["generation"] + 1
        replaced["status"] = stored.get("status", {})  # status is its own subresource: PUT cannot change it
        self._bump(replaced)
        self.virtual_services[(ns, name)] = replaced
        self._istiod_reconcile(replaced)
        return _public(replaced)

    def _istiod_reconcile(self, stored: dict[str, Any]) -> None:
        generation = stored["metadata"]["generation"]
        if self._istiod_paused or stored.get("status", {}).get("observedGeneration") == generation:
            return
        stored["status"] = {"observedGeneration": generation, "conditions": [
            {"type": "Reconciled", "status": "True", "lastProbeTime": _now(), "lastTransitionTime": _now(),
             "message": "Reconciled across all proxies"}]}
        self._bump(stored)  # istiod's status write is a write like any other

    # -- pods ---------------------------------------------------------------------------------------
    def _list_pods(self, ns: str, selector: str) -> dict[str, Any]:
        wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
        items = [_public(p) for (pns, _), p in sorted(self.pods.items(), key=lambda kv: kv[1]["metadata"]["_seq"])
                 if pns == ns and all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())]
        return {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": str(self._latest)},
                "items": items}

    def _pod(self, ns: str, name: str) -> dict[str, Any]:
        try:
            return self.pods[(ns, name)]
        except KeyError:
            raise _Refused(404, "NotFound", f'pods "{name}" not found') from None

    def _patch_pod(self, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        pod = self._pod(ns, name)
        meta = body.get("metadata", {})
        sent = meta.get("resourceVersion")
        if sent is not None and sent != pod["metadata"]["resourceVersion"]:
            raise _Refused(409, "Conflict", f'Operation cannot be fulfilled on pods "{name}": the object has been '
                                            "modified; please apply your changes to the latest version and try again")
        for section in ("labels", "annotations"):
            merged = {**pod["metadata"].get(section, {}), **meta.get(section, {})}
            pod["metadata"][section] = {k: v for k, v in merged.items() if v is not None}
        self._bump(pod)
        self._pod_event("MODIFIED", pod)
        return _public(pod)

    def _delete_pod(self, ns: str, name: str, grace: int | None) -> dict[str, Any]:
        pod = self._pod(ns, name)
        self.deleted.append((name, grace))
        if grace == 0:
            del self.pods[(ns, name)]
            self._pod_event("DELETED", pod)
        else:
            pod["metadata"].setdefault("deletionTimestamp", _now())
            pod["metadata"]["deletionGracePeriodSeconds"] = 30 if grace is None else grace
            self._bump(pod)
            self._pod_event("MODIFIED", pod)
        self._reconcile_owner(ns, pod["metadata"]["labels"].get("_owner"))
        return _public(pod)

    # -- pod watches ----------------------------------------------------------------------------------
    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        """Log a change for watches (a deletion is a write too: it gets a resourceVersion of its own)."""
        if kind == "DELETED":
            pod = copy.deepcopy(pod)
            self._bump(pod)
        self._pod_events.append((int(pod["metadata"]["resourceVersion"]), kind, pod["metadata"]["namespace"],
                                 {**_public(pod), "_labels": dict(pod["metadata"].get("labels", {}))}))
        self._changed.notify_all()

    def _serve_watch(self, handler: BaseHTTPRequestHandler, ns: str, query: dict[str, str]) -> None:
        """Stream the events after `resourceVersion` until `timeoutSeconds` (chunked, one JSON event a line)."""
        wanted = dict(term.split("=", 1) for term in query.get("labelSelector", "").split(",") if term)
        since = int(query.get("resourceVersion") or 0)
        timeout = min(float(query.get("timeoutSeconds") or 60), 300.0)
        with self._lock:
            self.watches += 1
            self.requests.append(EmulatedRequest("GET", handler.path.split("?")[0], 200, None))
            epoch = self._watch_epoch
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

        def send(event: dict[str, Any]) -> None:
            line = json.dumps(event).encode() + b"\n"
            handler.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            handler.wfile.flush()

        deadline = threading.Event()
        timer = threading.Timer(timeout, lambda: (deadline.set(), self._notify()))
        timer.daemon = True
        timer.start()
        try:
            while True:
                with self._lock:
                    if since and since < self._compacted_to:
                        events = [{"type": "ERROR", "object": {
                            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 410,
                            "reason": "Expired", "message": f"too old resource version: {since} "
                                                            f"({self._compacted_to})"}}]
                        done = True
                    else:
                        events = [{"type": kind, "object": {k: v for k, v in pod.items() if k != "_labels"}}
                                  for rv, kind, pns, pod in self._pod_events if rv > since and pns == ns
                                  and all(pod["_labels"].get(k) == v for k, v in wanted.items())]
                        since = max([since, *(rv for rv, *_ in self._pod_events)])
                        done = deadline.is_set() or epoch != self._watch_epoch
                        if not events and not done:
                            self._changed.wait()
                            continue
                for event in events:
                    send(event)
                if done:
                    break
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionError):
            handler.close_connection = True
        finally:
            timer.cancel()

    def _notify(self) -> None:
        with self._lock:
            self._changed.notify_all()

    # -- bookkeeping ----------------------------------------------------------------------------------
    def _bump(self, obj: dict[str, Any]) -> None:
        self._latest = next(self._revision)
        obj["metadata"]["resourceVersion"] = str(self._latest)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client closing its keep-alive connection is not an error; anything else is printed."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _check_virtual_service(body: dict[str, Any]) -> None:
    """The parts of Istio's VirtualService schema the mesh driver writes; raises ValueError naming the field."""
    if body.get("apiVersion") not in ("networking.istio.io/v1", "networking.istio.io/v1beta1"):
        raise ValueError(f"apiVersion {body.get('apiVersion')!r} is not networking.istio.io/v1 or v1beta1")
    if body.get("kind") != "VirtualService":
        raise ValueError(f"kind {body.get('kind')!r} is not VirtualService")
    if not isinstance(body.get("metadata"), dict) or not body["metadata"].get("name"):
        raise ValueError("metadata.name is required")
    http = (body.get("spec") or {}).get("http")
    if not isinstance(http, list) or not http:
        raise ValueError("spec.http must be a non-empty list")
    for i, route in enumerate(http):
        destinations = route.get("route") if isinstance(route, dict) else None
        if not isinstance(destinations, list) or not destinations:
            raise ValueError(f"spec.http[{i}].route must be a non-empty list")
        total = 0
        for j, destination in enumerate(destinations):
            where = f"spec.http[{i}].route[{j}]"
            if not isinstance((destination.get("destination") or {}).get("host"), str):
                raise ValueError(f"{where}.destination.host is required")
            weight = destination.get("weight", 0)
            if not isinstance(weight, int) or isinstance(weight, bool) or not 0 <= weight <= 100:
                raise ValueError(f"{where}.weight must be an integer in 0..100, not {weight!r}")
            total += weight
        if len(destinations) > 1 and total != 100:
            raise ValueError(f"spec.http[{i}]: total destination weight {total} != 100")


def _deletion_rank(item: tuple[tuple[str, str], dict[str, Any]]) -> tuple[int, int, int]:
    pod = item[1]
    cost = int(pod["metadata"].get("annotations", {}).get(DELETION_COST, "0"))
    return (_ready(pod), cost, -pod["metadata"]["_seq"])


def _ready(pod: dict[str, Any]) -> int:
    return int(any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", [])))


def _annotate_by_someone_else(deployment: dict[str, Any]) -> None:
    annotations = deployment["metadata"].setdefault("annotations", {})
    annotations["example.com/touched-by"] = "another-writer"


def _public(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as the API serves it: without the emulator's private bookkeeping."""
    shown = copy.deepcopy(obj)
    meta = shown["metadata"]
    meta.pop("_seq", None)
    meta.get("labels", {}).pop("_owner", None)
    return shown


def _condition(kind: str, ready: bool) -> dict[str, str]:
    return {"type": kind, "status": "True" if ready else "False", "lastTransitionTime": _now()}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _uid(ns: str, name: str) -> str:
    digest = hashlib.sha256(f"{ns}/{name}".encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
