"""The `kubernetes` pool driver: one Deployment per region × zone × version, scaled by the agent.

    start(id, zone, version)  ensure the Deployment; claim a pod of it nobody holds (one the ReplicaSet
                              made to replace a lost one), else scale to held + 1 and claim the new pod:
                              label it lifeline.dev/instance=<id>; its URL is the pod IP (waits for one)
    adopt()                   the region's pods that carry an instance label and are not being deleted: a
                              previous agent's pool, taken back as it is (nothing is scaled or relabelled)
    alive(id) / ready(id)     from the pods as last seen: a watch on the region's pods (an informer's
                              list-then-watch), else a list on each `refresh()` and every `resync_interval`
    stop(id, graceful)        delete that pod (grace 0 unless graceful: SIGTERM, the engine drains), then
                              scale to the pods still held

A Deployment cannot be told which pod to remove when it scales down: the
ReplicaSet picks (not ready before ready, then lower
`controller.kubernetes.io/pod-deletion-cost`, then newest). So `stop`
deletes the pod itself first; the ReplicaSet replaces it with a spare, and
the scale-down that follows removes that spare, which ranks first: it is not
ready and claimed pods carry a deletion cost of 1000. Scaling down first and
leaving the pick to the cost alone would remove a loading (not ready) pod
the agent holds instead of a ready one it is retiring.

The replica count is written level-triggered — set to the pods held, read
from the cluster, not ±1 — so a lost pod, a spare left by a crash between
scale and claim, or a replay of the same call converge. Each write is a
read-modify-write on `resourceVersion`: a 409 (someone else wrote between
our read and our write) is re-read and retried up to `conflict_retries`
times; a pod claim carries the pod's resourceVersion as a precondition, so
two claimers cannot take the same pod.

Every object the driver sends (a Deployment, a pod's metadata patch) is
validated with `kubernetes_validate`, strict, for `kubernetes_version`,
before it leaves: a bad setting (a misspelt resources key, a string where a
port goes) stops at `PoolObjectInvalid`, naming the field, not at the API
server. Label values the driver makes are checked against Kubernetes' label
syntax too, which the schema does not carry.

The `kubernetes` client is synchronous (urllib3); calls run in a thread so
the agent's loop keeps probing. Reads use raw JSON (`_preload_content=False`)
so what is sent back is what was read, field for field.

The watch (`watch: true`, the default) is what an informer does: list the
region's pods, then watch from the list's resourceVersion; each ADDED /
MODIFIED / DELETED event updates the pods the driver holds, so a lost or
ready pod is seen as the API server streams it and `refresh()` (the agent
calls it every probe interval) costs the API server nothing while the watch
is open. A watch the server ends is resumed from its last resourceVersion;
one that answers 410 Gone (history compacted) is listed again and resumed;
while none is open, `refresh()` lists, as with `watch: false`. The watch
runs in a daemon thread (the client is synchronous) and hands each event
to the agent's loop.

Limits: the engine in a pod names itself after the pod (`$(POD_NAME)`), not
the agent's instance id, which is on the pod's label; the pod template is
written when the Deployment is created and not rolled when settings change.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
from typing import Any

import kubernetes_validate
from kubernetes import watch as kube_watch
from kubernetes.client import ApiClient, AppsV1Api, CoreV1Api
from kubernetes.client.exceptions import ApiException

from common.logs import get_logger
from warm_pool.driver import PoolDriverError, PoolInstance
from warm_pool.settings import KubernetesPoolConfig

log = get_logger(__name__)

LABEL_APP = "app.kubernetes.io/name"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_REGION = "lifeline.dev/region"
LABEL_ZONE = "lifeline.dev/zone"
LABEL_VERSION = "lifeline.dev/version"
LABEL_INSTANCE = "lifeline.dev/instance"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
CLAIMED_DELETION_COST = "1000"  # spares (no annotation: 0) go first when the ReplicaSet scales down
WATCH_TIMEOUT_S = 30  # a watch asks the server to end it after this; it is resumed from its resourceVersion
APP = "lifeline-engine"
MANAGER = "lifeline-agent"

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MAX_DEPLOYMENT_NAME = 47  # pod names add "-<10 hash>-<5>" and must fit a 63-character hostname


class PoolObjectInvalid(Exception):
    """An object the driver would send fails Kubernetes' schema (or label syntax): nothing was sent."""


def api_client_for(config: KubernetesPoolConfig) -> ApiClient:
    """A client for `pool.kubernetes`' way in: `api_url`, `kubeconfig` (+ `context`), else in-cluster."""
    from kubernetes import config as kube_config
    from kubernetes.client import Configuration
    from kubernetes.config.config_exception import ConfigException

    if config.api_url:
        configuration = Configuration()
        configuration.host = config.api_url.rstrip("/")
        return ApiClient(configuration)
    try:
        if config.kubeconfig is not None:
            return kube_config.new_client_from_config(config_file=str(config.kubeconfig), context=config.context)
        configuration = Configuration()
        kube_config.load_incluster_config(client_configuration=configuration)
        return ApiClient(configuration)
    except (ConfigException, OSError) as exc:
        where = f"pool.kubernetes.kubeconfig ({config.kubeconfig})" if config.kubeconfig else \
            "pool.kubernetes (no api_url or kubeconfig: in-cluster config)"
        raise PoolDriverError(f"{where}: {exc}") from None


class KubernetesDriver:
    """`PoolDriver` on a Kubernetes cluster; `api_client` from kubeconfig or in-cluster config."""

    def __init__(self, *, region: str, config: KubernetesPoolConfig, api_client: ApiClient,
                 model_dirs: dict[str, str] | None = None) -> None:
        self.region = region
        self.config = config
        self.model_dirs = model_dirs or {}  # version → its weights inside the pod; else config.model_dir
        self.apps = AppsV1Api(api_client)
        self.core = CoreV1Api(api_client)
        self.conflicts_retried = 0
        self._held: dict[str, dict[str, Any]] = {}  # instance id → its pod, as last listed
        self._placement: dict[str, tuple[str, str]] = {}  # instance id → (zone, version), for a pod that vanished
        self._locks: dict[str, asyncio.Lock] = {}
        self._resync: asyncio.Task | None = None
        self._watch_thread: threading.Thread | None = None
        self._watch_stop = threading.Event()
        self.watching = False  # a watch is open and the held pods are as it streams them
        self.watch_events = 0
        self.watch_relists = 0  # lists after a 410 Gone

    # -- naming and the objects sent ------------------------------------------------------------------
    def deployment_name(self, zone: str, version: str) -> str:
        wanted = f"{self.config.name_prefix}-{self.region}-{zone}-{version}".lower()
        if _DNS_LABEL.match(wanted) and len(wanted) <= _MAX_DEPLOYMENT_NAME:
            return wanted
        slug = re.sub(r"[^a-z0-9-]+", "-", wanted).strip("-")[: _MAX_DEPLOYMENT_NAME - 9].rstrip("-")
        return f"{slug}-{hashlib.sha256(wanted.encode()).hexdigest()[:8]}"

    def selector(self, zone: str | None = None, version: str | None = None) -> dict[str, str]:
        labels = {LABEL_APP: APP, LABEL_MANAGED_BY: MANAGER, LABEL_REGION: self.region}
        if zone is not None:
            labels[LABEL_ZONE] = zone
        if version is not None:
            labels[LABEL_VERSION] = version
        for key, value in labels.items():
            _check_label_value(key, value)
        return labels

    def deployment(self, zone: str, version: str, *, replicas: int = 0) -> dict[str, Any]:
        """The Deployment for one region × zone × version, as created (pure: no call)."""
        cfg = self.config
        labels = self.selector(zone, version)
        fill = {"version": version, "zone": zone, "region": self.region, "port": cfg.port}
        fill["model_dir"] = self.model_dirs.get(version) or cfg.model_dir.format(**fill)
        container: dict[str, Any] = {
            "name": "engine",
            "image": cfg.image,
            "command": list(cfg.command),
            "args": [arg.format(**fill) if "$(" not in arg else arg for arg in cfg.args],
            "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "ports": [{"name": "http", "containerPort": cfg.port}],
            "readinessProbe": {"httpGet": {"path": cfg.readiness_path, "port": "http"}, "periodSeconds": 2},
        }
        if cfg.resources:
            container["resources"] = cfg.resources
        pod_spec: dict[str, Any] = {
            "containers": [container],
            "nodeSelector": {cfg.zone_node_label: zone},
            "terminationGracePeriodSeconds": int(cfg.termination_grace.total_seconds()),
        }
        if cfg.models_claim:
            container["volumeMounts"] = [{"name": "models", "mountPath": "/models", "readOnly": True}]
            pod_spec["volumes"] = [{"name": "models",
                                    "persistentVolumeClaim": {"claimName": cfg.models_claim, "readOnly": True}}]
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": self.deployment_name(zone, version), "namespace": cfg.namespace, "labels": labels},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                # the agent picks which pod leaves (stop deletes it); a rolling surge would add unheld pods
                "strategy": {"type": "Recreate"},
                "template": {"metadata": {"labels": labels}, "spec": pod_spec},
            },
        }

    def validate(self, obj: dict[str, Any]) -> dict[str, Any]:
        try:
            kubernetes_validate.validate(obj, self.config.kubernetes_version, strict=True)
        except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            where = "/".join(str(p) for p in getattr(exc, "path", ()) or ())
            raise PoolObjectInvalid(f"{obj.get('kind')} {obj.get('metadata', {}).get('name', '')}: "
                                    f"{first}{f' at {where}' if where else ''}") from None
        return obj

    # -- the PoolDriver calls ------------------------------------------------------------------------------
    async def start(self, *, instance_id: str, zone: str, version: str) -> PoolInstance:
        _check_label_value(LABEL_INSTANCE, instance_id)
        name = self.deployment_name(zone, version)
        async with self._lock(name):
            await self._ensure_deployment(zone, version)
            self._placement[instance_id] = (zone, version)
            pod = await self._claim(name, zone, version, instance_id)
        self._held[instance_id] = pod
        self._start_resync()
        log.info("pool pod claimed", instance=instance_id, deployment=name, pod=pod["metadata"]["name"],
                 ip=pod["status"]["podIP"])
        return PoolInstance(instance_id, zone, version, f"http://{pod['status']['podIP']}:{self.config.port}")

    def alive(self, instance_id: str) -> bool:
        pod = self._held.get(instance_id)
        return pod is not None and not _deleting(pod) and pod["status"].get("phase") in ("Pending", "Running")

    def ready(self, instance_id: str) -> bool:
        pod = self._held.get(instance_id)
        return pod is not None and self.alive(instance_id) and _ready(pod)

    async def stop(self, instance_id: str, *, graceful: bool) -> None:
        pods = await self._list({**self.selector(), LABEL_INSTANCE: instance_id})
        pod = pods[0] if pods else None
        if pod is not None:
            zone, version = pod["metadata"]["labels"][LABEL_ZONE], pod["metadata"]["labels"][LABEL_VERSION]
        elif instance_id in self._placement:
            zone, version = self._placement[instance_id]
        else:
            log.warning("no pod holds this instance; nothing to stop", instance=instance_id)
            return
        name = self.deployment_name(zone, version)
        async with self._lock(name):
            if pod is not None and not _deleting(pod):
                await self._delete_pod(pod["metadata"]["name"], graceful=graceful)
            remaining = await self._list(self.selector(zone, version))
            held = [p for p in remaining if _holder(p) not in (None, instance_id) and not _deleting(p)]
            await self._scale(name, len(held))
        self._held.pop(instance_id, None)
        self._placement.pop(instance_id, None)
        log.info("pool pod stopped", instance=instance_id, deployment=name, graceful=graceful, replicas=len(held))

    async def adopt(self) -> list[PoolInstance]:
        """The pods a previous agent of this region claimed, so a restarted agent keeps its pool.

        The labels say everything needed: instance id, zone, version; the Deployment already counts them
        as held (the replica count is written from the labels), so nothing is written here.
        """
        found = []
        for pod in await self._list(self.selector()):
            holder, ip = _holder(pod), pod["status"].get("podIP")
            if holder is None or _deleting(pod) or not ip:
                continue
            labels = pod["metadata"]["labels"]
            self._placement[holder] = (labels[LABEL_ZONE], labels[LABEL_VERSION])
            self._held[holder] = pod
            found.append(PoolInstance(holder, labels[LABEL_ZONE], labels[LABEL_VERSION],
                                      f"http://{ip}:{self.config.port}"))
        if found:
            self._start_resync()
            log.info("pool pods adopted", instances=sorted(p.instance_id for p in found))
        return found

    async def refresh(self) -> None:
        """Re-read every pod of the region the agent holds (what `alive` and `ready` answer from): from the
        watch while one is open, else a list."""
        if self.watching:
            return
        self._apply_list(await self._list(self.selector()))

    async def close(self) -> None:
        self._watch_stop.set()
        self.watching = False
        if self._resync is not None:
            self._resync.cancel()
            self._resync = None

    def _apply_list(self, pods: list[dict[str, Any]]) -> None:
        listed = {holder: pod for pod in pods if (holder := _holder(pod)) is not None}
        self._held = {instance_id: listed[instance_id] for instance_id in self._placement if instance_id in listed}

    def _apply_event(self, kind: str, pod: dict[str, Any]) -> None:
        self.watch_events += 1
        holder = _holder(pod)
        if holder is None or holder not in self._placement:
            return
        if kind == "DELETED":
            if self._held.get(holder, {}).get("metadata", {}).get("name") == pod["metadata"]["name"]:
                del self._held[holder]
        elif kind in ("ADDED", "MODIFIED"):
            self._held[holder] = pod

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """List, then watch from the list's resourceVersion; resume, or list again after 410 Gone (a thread)."""
        selector = ",".join(f"{k}={v}" for k, v in self.selector().items())
        version: str | None = None
        try:
            while not self._watch_stop.is_set():
                try:
                    if version is None:
                        response = self.core.list_namespaced_pod(self.config.namespace, label_selector=selector,
                                                                 _preload_content=False)
                        listing = json.loads(response.data)
                        version = listing["metadata"]["resourceVersion"]
                        loop.call_soon_threadsafe(self._apply_list, listing["items"])
                    stream = kube_watch.Watch()
                    self.watching = True
                    for event in stream.stream(self.core.list_namespaced_pod, self.config.namespace,
                                               label_selector=selector, resource_version=version,
                                               timeout_seconds=WATCH_TIMEOUT_S):
                        pod = event["raw_object"]
                        version = pod["metadata"]["resourceVersion"]
                        loop.call_soon_threadsafe(self._apply_event, event["type"], pod)
                        if self._watch_stop.is_set():
                            stream.stop()
                except ApiException as exc:
                    self.watching = False
                    if exc.status != 410:
                        raise
                    self.watch_relists += 1
                    log.info("pod watch expired (410 Gone); listing again", resource_version=version)
                    version = None
                except RuntimeError:
                    return  # the agent's loop is closed
                except Exception as exc:  # the API server away: refresh() lists meanwhile
                    self.watching = False
                    log.warning("pod watch failed; listing until it is back", error=repr(exc)[:200])
                    version = None
                    self._watch_stop.wait(self.config.resync_interval.total_seconds())
        finally:
            self.watching = False

    # -- steps ------------------------------------------------------------------------------------------------
    async def _ensure_deployment(self, zone: str, version: str) -> None:
        name = self.deployment_name(zone, version)
        try:
            await self._read_deployment(name)
            return
        except ApiException as exc:
            if exc.status != 404:
                raise
        body = self.validate(self.deployment(zone, version))
        try:
            await asyncio.to_thread(self.apps.create_namespaced_deployment, self.config.namespace, body)
            log.info("deployment created", deployment=name)
        except ApiException as exc:
            if exc.status != 409:  # AlreadyExists: another agent (or our last life) made it first
                raise

    async def _claim(self, name: str, zone: str, version: str, instance_id: str) -> dict[str, Any]:
        polls = max(1, round(self.config.claim_timeout / self.config.poll_interval))
        for _ in range(polls):
            pods = await self._list(self.selector(zone, version))
            held = [p for p in pods if _holder(p) is not None and not _deleting(p)]
            if mine := [p for p in held if _holder(p) == instance_id]:
                return mine[0]  # a replay after a claim whose answer was lost
            spares = [p for p in pods if _holder(p) is None and not _deleting(p) and p["status"].get("podIP")]
            for spare in spares:
                claimed = await self._label(spare, instance_id)
                if claimed is not None:
                    await self._scale(name, len(held) + 1)
                    return claimed
            await self._scale(name, len(held) + 1)
            await asyncio.sleep(self.config.poll_interval.total_seconds())
        raise PoolDriverError(f"no pod of {name} to claim for {instance_id} within "
                              f"{self.config.claim_timeout.total_seconds():g} s")

    async def _label(self, pod: dict[str, Any], instance_id: str) -> dict[str, Any] | None:
        """Claim a pod: its resourceVersion is a precondition, so a pod claimed meanwhile answers 409."""
        meta = pod["metadata"]
        patch = self.validate({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": meta["name"], "resourceVersion": meta["resourceVersion"],
                         "labels": {LABEL_INSTANCE: instance_id},
                         "annotations": {DELETION_COST: CLAIMED_DELETION_COST}},
        })
        try:
            response = await asyncio.to_thread(self.core.patch_namespaced_pod, meta["name"], self.config.namespace,
                                               patch, _preload_content=False)
        except ApiException as exc:
            if exc.status in (404, 409):
                log.info("pod taken or gone before the claim; trying another", pod=meta["name"], status=exc.status)
                return None
            raise
        return json.loads(response.data)

    async def _scale(self, name: str, replicas: int) -> None:
        for attempt in range(self.config.conflict_retries + 1):
            deployment = await self._read_deployment(name)
            if deployment["spec"].get("replicas") == replicas:
                return
            deployment["spec"]["replicas"] = replicas
            body = self.validate(deployment)
            try:
                await asyncio.to_thread(self.apps.replace_namespaced_deployment, name, self.config.namespace, body,
                                        _preload_content=False)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
                self.conflicts_retried += 1
                log.info("deployment changed since read; re-reading", deployment=name, attempt=attempt + 1)
        raise PoolDriverError(f"scaling {name} to {replicas}: {self.config.conflict_retries + 1} conflicts in a row")

    async def _delete_pod(self, pod_name: str, *, graceful: bool) -> None:
        kwargs = {} if graceful else {"grace_period_seconds": 0}
        try:
            await asyncio.to_thread(self.core.delete_namespaced_pod, pod_name, self.config.namespace,
                                    _preload_content=False, **kwargs)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def _read_deployment(self, name: str) -> dict[str, Any]:
        response = await asyncio.to_thread(self.apps.read_namespaced_deployment, name, self.config.namespace,
                                           _preload_content=False)
        return json.loads(response.data)

    async def _list(self, labels: dict[str, str]) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        response = await asyncio.to_thread(self.core.list_namespaced_pod, self.config.namespace,
                                           label_selector=selector, _preload_content=False)
        return json.loads(response.data)["items"]

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def _start_resync(self) -> None:
        if self._resync is None:
            self._resync = asyncio.create_task(self._resync_loop(), name="kubernetes-pool-resync")
        if self.config.watch and self._watch_thread is None:
            self._watch_thread = threading.Thread(target=self._watch, args=(asyncio.get_running_loop(),),
                                                  name="kubernetes-pool-watch", daemon=True)
            self._watch_thread.start()

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.resync_interval.total_seconds())
            try:
                await self.refresh()
            except Exception as exc:  # the API server away: keep the last list, try again next interval
                log.warning("pod list failed; alive() answers from the last one", error=repr(exc)[:200])


def _check_label_value(key: str, value: str) -> None:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise PoolObjectInvalid(f"label {key}={value!r} is not a valid Kubernetes label value "
                                "(63 characters at most: letters, digits, '-', '_', '.', alphanumeric at both ends)")


def _holder(pod: dict[str, Any]) -> str | None:
    return pod["metadata"].get("labels", {}).get(LABEL_INSTANCE)


def _deleting(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod["status"].get("conditions") or [])
