"""The holder's tenants: engines lease its regions by instance id and boot generation, and may take over.

Moved out of holder/service.py unchanged; the holder owns one `TenantLeases`
and every change here is a ledger record through the holder's `record` under
the holder's lock. A tenant that stops renewing for `lease_ttl` is frozen,
computed at read (`view`) from the last renewal this process saw; nothing of
a frozen tenant's is reused. The same tenant id under a higher generation
takes over; a different tenant id never takes another's blocks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.logs import get_logger
from contract.holder import AttachResponse, HeartbeatResponse, TenantState, TenantView
from holder.errors import TenantSuperseded, UnknownTenant
from holder.regions import KVBlockState, TenantRecord

if TYPE_CHECKING:
    from holder.service import MemoryHolder

log = get_logger(__name__)


class TenantLeases:
    def __init__(self, holder: MemoryHolder) -> None:
        self.holder = holder
        self.last_heartbeat: dict[str, float] = {}  # tenant id → clock.now() of its last renewal
        self._announced_frozen: set[tuple[str, int]] = set()  # log dedup only, never consulted for decisions

    def view(self, tenant: TenantRecord) -> TenantView:
        holder = self.holder
        ttl = holder.settings.lease_ttl.total_seconds()
        expires_in = self.last_heartbeat.get(tenant.tenant_id, float("-inf")) + ttl - holder.clock.now()
        frozen = tenant.state is not TenantState.RELEASED and expires_in <= 0
        return TenantView(tenant_id=tenant.tenant_id, generation=tenant.generation, state=tenant.state, frozen=frozen,
                          lease_expires_in_s=max(expires_in, 0.0) if expires_in != float("-inf") else 0.0,
                          takeovers=tenant.takeovers)

    def current(self, tenant_id: str) -> TenantRecord:
        tenant = self.holder.state.tenants.get(tenant_id)
        if tenant is None or tenant.state is TenantState.RELEASED:
            raise UnknownTenant(f"tenant {tenant_id!r} is not attached; attach first")
        return tenant

    @staticmethod
    def check_generation(tenant: TenantRecord, generation: int) -> None:
        if generation < tenant.generation:
            raise TenantSuperseded(f"tenant {tenant.tenant_id!r} is held by generation {tenant.generation}; "
                                   f"{generation} is older")
        if generation > tenant.generation:
            raise UnknownTenant(f"generation {generation} of {tenant.tenant_id!r} has not attached; attach first")

    def attach(self, tenant_id: str, generation: int) -> AttachResponse:
        holder = self.holder
        with holder.lock:
            weights = holder.ready_weights()
            current = holder.state.tenants.get(tenant_id)
            live = current is not None and current.state is not TenantState.RELEASED
            if live and generation < current.generation:
                raise TenantSuperseded(f"tenant {tenant_id!r} is held by generation {current.generation}; "
                                       f"{generation} is older")
            takeover = live and generation > current.generation
            if not live or generation != current.generation:
                if takeover:
                    previous = self.view(current)
                    log.warning("tenant takeover", tenant=tenant_id, old_generation=current.generation,
                                new_generation=generation, old_frozen=previous.frozen)
                holder.record({"op": "attach", "tenant": tenant_id, "generation": generation})
            self.last_heartbeat[tenant_id] = holder.clock.now()
            tenant = holder.state.tenants[tenant_id]
            log.info("tenant attached", tenant=tenant_id, generation=generation, takeover=takeover, state=tenant.state)
            return AttachResponse(holder_epoch=holder.epoch, tenant=self.view(tenant), takeover=takeover,
                                  heartbeat_interval_s=holder.settings.heartbeat_interval.total_seconds(),
                                  lease_ttl_s=holder.settings.lease_ttl.total_seconds(), weights=weights, kv=holder.kv)

    def heartbeat(self, tenant_id: str, generation: int) -> HeartbeatResponse:
        holder = self.holder
        with holder.lock:
            tenant = self.current(tenant_id)
            self.check_generation(tenant, generation)
            view = self.view(tenant)
            if view.frozen:
                # A late renewal from the same generation: nothing was handed to anyone else
                # (frozen blocks are never reused), so the tenant simply resumes.
                log.info("frozen tenant renewed", tenant=tenant_id, generation=generation)
            self.last_heartbeat[tenant_id] = holder.clock.now()
            self._announced_frozen.discard((tenant_id, generation))
            return HeartbeatResponse(holder_epoch=holder.epoch, tenant=self.view(tenant))

    def confirm(self, tenant_id: str, generation: int) -> TenantView:
        """The tenant has a consistent view (self-test passed): a takeover completes."""
        holder = self.holder
        with holder.lock:
            tenant = self.current(tenant_id)
            self.check_generation(tenant, generation)
            if tenant.state is TenantState.TAKING_OVER:
                holder.record({"op": "confirm", "tenant": tenant_id, "generation": generation})
                log.info("takeover confirmed", tenant=tenant_id, generation=generation)
            self.last_heartbeat[tenant_id] = holder.clock.now()
            return self.view(tenant)

    def release(self, tenant_id: str, generation: int) -> TenantView:
        """The tenant's clean shutdown: its lease ends and nothing is kept for a successor."""
        holder = self.holder
        with holder.lock:
            tenant = self.current(tenant_id)
            self.check_generation(tenant, generation)
            for block in [b.block for b in holder.state.kv_blocks.values()
                          if b.owner == tenant_id and b.state is KVBlockState.RESERVED]:
                holder.record({"op": "kv_free", "block": block, "reason": "tenant released"})
            holder.record({"op": "release", "tenant": tenant_id, "generation": generation})
            self.last_heartbeat.pop(tenant_id, None)
            log.info("tenant released", tenant=tenant_id, generation=generation)
            return self.view(tenant)

    def views(self) -> list[TenantView]:
        with self.holder.lock:
            return [self.view(t) for t in self.holder.state.tenants.values()]

    def announce_frozen(self) -> list[TenantView]:
        """Log each tenant the moment its lease is seen expired (called every few hundred ms)."""
        newly = []
        with self.holder.lock:
            for tenant in self.holder.state.tenants.values():
                view = self.view(tenant)
                key = (tenant.tenant_id, tenant.generation)
                if view.frozen and key not in self._announced_frozen:
                    self._announced_frozen.add(key)
                    newly.append(view)
                    log.warning("tenant lease expired; blocks frozen for a successor", tenant=tenant.tenant_id,
                                generation=tenant.generation)
        return newly
