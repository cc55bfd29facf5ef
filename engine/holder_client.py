"""The engine as a tenant of the memory holder (`lifeline holder serve`, docs/holder.md).

`attach_weights` asks the holder for its weights region and builds one torch
tensor per weight as a view into the region file — nothing is read from disk
and nothing is copied: the pages are the holder's, in /dev/shm. The file is
mapped copy-on-write (`MAP_PRIVATE`): reads share the holder's pages, and a
tenant that writes into a weight (a fault drill, a bug) gets a private copy of
that page instead of corrupting every other tenant's weights.

On a GPU (`holder serve --device cuda[:N]`) the holder also keeps the region's
bytes in one device allocation and exports its CUDA IPC handle in the
description; `map_device_weights` opens it and builds the same views there.
The reference engine computes on CPU and keeps using `map_weights`; a CUDA
tenant uses `map_device_weights` with the same attach, lease and confirm.

`HolderTenancy` keeps the tenant's lease: a heartbeat every
`heartbeat_interval_s` (1 s) from a daemon thread, `confirm` once the
self-test passed (the holder then ends a takeover), `release` on a clean
shutdown. If the holder dies after the engine attached, the mapped pages stay
valid and the engine keeps serving; it says so (`holder_connected` 0, one
log line) and renews again when a holder answers.

A standby that knows which holder it will serve from (engine/standby.py,
"primed") reads `weights_snapshot` — the description and the holder's boot
epoch, no tenancy — and maps it with `map_region_weights(prefault=True)`
long before it attaches; `region_file_id` lets the engine it becomes check
that the file it mapped is still the one the holder describes.

Any failure to attach — holder unreachable, not ready, another model or
dtype — raises `HolderUnavailable`; the runtime then loads from disk and says
so (`engine.runtime`).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import torch

from common.logs import get_logger
from common import oneshot_http
from contract.holder import (
    SUPERSEDED_ERROR_TYPE,
    AttachResponse,
    HeartbeatResponse,
    WeightsDescription,
    WeightsSnapshot,
)

log = get_logger(__name__)

TIMEOUT = httpx.Timeout(connect=0.5, read=5.0, write=2.0, pool=1.0)


class HolderUnavailable(Exception):
    """The engine cannot use the holder's weights; `str()` says why, for the log and /healthz/weights."""


def _error_type(response: httpx.Response) -> str | None:
    try:
        return response.json()["error"]["type"]
    except (ValueError, KeyError, TypeError):
        return None


def attach(url: str, tenant_id: str, generation: int) -> AttachResponse:
    try:
        response = oneshot_http.post(f"{url}/v1/tenants/attach", json={"tenant_id": tenant_id, "generation": generation},
                                     timeout=TIMEOUT)
    except httpx.HTTPError as exc:
        raise HolderUnavailable(f"holder at {url} unreachable: {exc!r}") from None
    if response.status_code != 200:
        raise HolderUnavailable(f"holder at {url} refused the attach: HTTP {response.status_code} {response.text[:300]}")
    return AttachResponse.model_validate_json(response.content)


def check_compatible(description: WeightsDescription, model_dir: Path, dtype: torch.dtype) -> None:
    """Refuse weights of another architecture or dtype: a miss (load from disk), never a misuse."""
    config_sha = hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest()
    if description.config_sha256 != config_sha:
        raise HolderUnavailable(f"holder holds weights for another config.json ({description.model_dir})")
    wanted = str(dtype).removeprefix("torch.")
    if description.dtype != wanted:
        raise HolderUnavailable(f"holder holds {description.dtype} weights; this engine computes in {wanted}")


@dataclass(frozen=True)
class MappedWeights:
    """Tensor views over a region file, and which file they map: (st_dev, st_ino) when it was opened."""

    tensors: dict[str, torch.Tensor]
    file_id: tuple[int, int]


def region_file_id(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the region file now, or None when it is gone."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def map_region_weights(description: WeightsDescription, *, prefault: bool = False) -> MappedWeights:
    """One tensor per weight, each a view into the region file mapped copy-on-write.

    `prefault` reads one byte of every page, so each page-table entry already
    points at the holder's page before the first forward pass. A read fault on
    a private mapping shares the page (nothing is copied); a primed standby
    does this off the restart's path (engine/standby.py).
    """
    region = description.region
    try:
        with open(region.path, "rb") as handle:
            stat = os.fstat(handle.fileno())
            mapped = np.memmap(handle, dtype=np.uint8, mode="c", shape=(region.size,))
    except (OSError, ValueError) as exc:
        raise HolderUnavailable(f"cannot map region {region.region_id} at {region.path}: {exc}") from None
    if prefault:
        int(mapped[::mmap.PAGESIZE].sum(dtype=np.uint64))
    weights = {}
    for spec in region.tensors:
        array = mapped[spec.offset:spec.offset + spec.nbytes].view(spec.dtype).reshape(spec.shape)
        weights[spec.name] = torch.from_numpy(array)
    return MappedWeights(weights, (stat.st_dev, stat.st_ino))


def map_weights(description: WeightsDescription) -> dict[str, torch.Tensor]:
    """One tensor per weight, each a view into the region file mapped copy-on-write."""
    return map_region_weights(description).tensors


def weights_snapshot(url: str, client: httpx.Client | None = None) -> WeightsSnapshot:
    """The holder's sealed weights and its boot epoch, read without attaching (a standby's priming).

    `client` (with its own timeouts) replaces a one-off request, e.g. a test's in-process holder.
    """
    try:
        path = f"{url}/v1/weights/snapshot"
        response = client.get(path) if client is not None else oneshot_http.get(path, timeout=TIMEOUT)
    except httpx.HTTPError as exc:
        raise HolderUnavailable(f"holder at {url} unreachable: {exc!r}") from None
    if response.status_code != 200:
        raise HolderUnavailable(f"holder at {url} gave no weights: HTTP {response.status_code} {response.text[:300]}")
    return WeightsSnapshot.model_validate_json(response.content)


def map_device_weights(description: WeightsDescription, device: str) -> dict[str, torch.Tensor]:
    """One tensor per weight, each a view into the holder's device allocation opened through CUDA IPC.

    The holder must hold a device copy on this very device (`holder serve --device`);
    anything else is `HolderUnavailable` (a miss: the caller loads as it would without
    the holder). Opening the handle maps the holder's allocation into this process
    (`cudaIpcOpenMemHandle`); the views are offsets into it, nothing is copied. A
    process cannot open its own export: the holder and the tenant are always two processes.
    """
    copy = description.device_copy
    if copy is None:
        raise HolderUnavailable("the holder keeps no device copy of its weights (holder serve --device cuda)")
    if copy.device != device:
        raise HolderUnavailable(f"the holder's device copy is on {copy.device}; this tenant computes on {device}")
    if copy.region_checksum != description.region.checksum or copy.size != description.region.size:
        raise HolderUnavailable("the holder's device copy does not match its sealed region")
    if not torch.cuda.is_available():
        raise HolderUnavailable(f"the holder's weights are on {copy.device}, but this process sees no CUDA device")
    torch.cuda.init()  # what torch.multiprocessing's rebuild does before opening a handle
    try:
        storage = torch.UntypedStorage._new_shared_cuda(*copy.ipc.share_args())
    except RuntimeError as exc:
        raise HolderUnavailable(f"cannot open the holder's CUDA IPC handle: {exc}") from None
    buffer = torch.empty((0,), dtype=torch.uint8, device=copy.device)
    buffer.set_(storage, 0, (copy.size,), (1,))
    weights = {}
    for spec in description.region.tensors:
        raw = buffer[spec.offset:spec.offset + spec.nbytes]
        weights[spec.name] = raw.view(getattr(torch, spec.dtype)).view(spec.shape)
    return weights


class HolderTenancy:
    """The lease of one engine process (tenant id = instance id, generation = boot generation)."""

    def __init__(self, url: str, tenant_id: str, generation: int, interval_s: float) -> None:
        self.url = url
        self.tenant_id = tenant_id
        self.generation = generation
        self.interval_s = interval_s
        self.connected = True
        self.superseded = False
        self.holder_epoch: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="holder-heartbeat", daemon=True)
        self._client = httpx.Client(timeout=TIMEOUT)

    def start(self) -> None:
        self._thread.start()

    def _post(self, action: str) -> httpx.Response:
        return self._client.post(f"{self.url}/v1/tenants/{self.tenant_id}/{action}",
                                 json={"generation": self.generation})

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.renew()

    def renew(self) -> None:
        try:
            response = self._post("heartbeat")
            if response.status_code == 404:  # a holder that lost its ledger: attach again, same generation
                attach(self.url, self.tenant_id, self.generation)
                response = self._post("heartbeat")
        except (httpx.HTTPError, HolderUnavailable) as exc:
            if self.connected:
                log.warning("holder lost; serving on from the mapped weights", holder=self.url, error=repr(exc))
            self.connected = False
            return
        if response.status_code == 409 and _error_type(response) == SUPERSEDED_ERROR_TYPE:
            if not self.superseded:
                log.error("holder says a newer generation holds this tenant", holder=self.url)
            self.superseded = True
            self._stop.set()
            return
        if response.status_code != 200:
            if self.connected:
                log.warning("holder refused a heartbeat", status=response.status_code, body=response.text[:300])
            self.connected = False
            return
        beat = HeartbeatResponse.model_validate_json(response.content)
        if not self.connected:
            log.info("holder back", holder=self.url, holder_epoch=beat.holder_epoch)
        self.connected = True
        self.holder_epoch = beat.holder_epoch

    def confirm(self) -> None:
        """Tell the holder this generation has a consistent view (after the self-test)."""
        try:
            self._post("confirm").raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("holder did not take the confirmation", error=repr(exc))

    def release(self) -> None:
        """Clean shutdown: stop renewing and end the lease, so nothing is kept frozen for us."""
        self._stop.set()
        if self.superseded:
            return
        try:
            self._post("release")
        except httpx.HTTPError as exc:
            log.warning("holder did not take the release", error=repr(exc))
        finally:
            self._client.close()

    def stop(self) -> None:
        self._stop.set()
