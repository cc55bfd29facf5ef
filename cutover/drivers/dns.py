"""The dns tier: move a region's record on an authoritative server.

Region faults are cut over here (30 s – 5 min). The seed's dual TTL: the
external record clients resolve is short (60 s) so a cutover takes effect
within a minute of the write; the internal one is long (600 s) so a DNS
outage does not take the region's own services down with it. A cutover
moves the short-TTL record; `Verification.client_cache_ttl_s` is the TTL of
the answer it replaced, the time resolvers may keep serving the old region.

Two drivers, one `DnsState`:

- `Rfc2136Driver`: RFC 2136 UPDATE signed with TSIG (dnspython) over TCP to
  the primary, read back with a UDP query to the same authoritative server.
  Replace is one UPDATE (delete the RRset, add the new one) and idempotent,
  so it is retried when the server cannot be reached; BADSIG/BADKEY,
  NOTAUTH and REFUSED are refusals and are not. Measured on BIND 9.18 on
  loopback: the answer changes ~1 ms after the UPDATE's reply.
- `Route53Driver`: `ChangeResourceRecordSets` UPSERT through boto3, read back
  through `ListResourceRecordSets`. Route 53 answers PENDING until every
  authoritative server has the change; until `GetChange` says INSYNC the
  driver reports the record it replaced, so `verify` waits for INSYNC.
  Tested against moto's server (an emulator: no DNS server behind it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.query
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.tsig
import dns.tsigkeyring
import dns.update

from common.clock import Clock
from controlplane.event.models import RoutingTier
from cutover.driver import (
    DnsState,
    DnsTarget,
    DriverRejected,
    DriverUnavailable,
)
from cutover.drivers.polling import PollingDriver, retry_unavailable

EXTERNAL_TTL_S = 60
INTERNAL_TTL_S = 600


class _DnsPolling(PollingDriver[DnsState]):
    tier = RoutingTier.DNS

    def __init__(self, *, clock: Clock | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(clock=clock, sleep=sleep)
        self._replaced: dict[DnsTarget, DnsState] = {}

    def client_cache_ttl_s(self, expected: DnsState) -> int | None:
        replaced = self._replaced.get(expected.target)
        if replaced is not None and replaced.values and replaced.values != expected.values:
            return replaced.ttl_s
        return expected.ttl_s


class Rfc2136Driver(_DnsPolling):
    """RFC 2136 + TSIG against one authoritative primary (BIND9 in the tests)."""

    def __init__(self, *, server: str, port: int = 53, key_name: str, key_secret: str,
                 key_algorithm: str = "hmac-sha256", io_timeout_s: float = 2.0,
                 clock: Clock | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(clock=clock, sleep=sleep)
        self.server = server
        self.port = port
        self.key_name = dns.name.from_text(key_name)
        self.keyring = dns.tsigkeyring.from_text({key_name: (key_algorithm, key_secret)})
        self.key_algorithm = key_algorithm
        self.io_timeout_s = io_timeout_s

    @retry_unavailable()
    def observe(self, target: DnsTarget) -> tuple[DnsState, str]:  # type: ignore[override]
        query = dns.message.make_query(target.name, target.rdtype)
        query.flags &= ~dns.flags.RD  # an authoritative answer, not a resolver's
        try:
            answer = dns.query.udp(query, self.server, port=self.port, timeout=self.io_timeout_s)
        except (dns.exception.Timeout, OSError) as exc:
            raise DriverUnavailable(f"DNS query to {self.server}:{self.port} failed: {exc!r}") from exc
        rcode = answer.rcode()
        if rcode not in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN):
            raise DriverRejected(f"{self.server}:{self.port} answered {dns.rcode.to_text(rcode)} "
                                 f"for {target.name} {target.rdtype}")
        rrset = answer.get_rrset(answer.answer, dns.name.from_text(target.name), dns.rdataclass.IN,
                                 dns.rdatatype.from_text(target.rdtype))
        aa = "aa" if answer.flags & dns.flags.AA else "not-aa"
        if rrset is None:
            state = DnsState(target=target, values=(), ttl_s=0)
            evidence = f"@{self.server}:{self.port} {target.name} {target.rdtype}: {dns.rcode.to_text(rcode)} ({aa})"
        else:
            state = DnsState(target=target, values=tuple(sorted(r.to_text() for r in rrset)), ttl_s=rrset.ttl)
            evidence = f"@{self.server}:{self.port} ({aa}) " + rrset.to_text().replace("\n", "; ")
        return state, evidence

    def _write(self, desired: DnsState) -> None:  # type: ignore[override]
        replaced = self.read_state(desired.target)
        self._send_update(desired)
        self._replaced[desired.target] = replaced

    @retry_unavailable()
    def _send_update(self, desired: DnsState) -> None:
        target = desired.target
        update = dns.update.Update(target.zone, keyring=self.keyring, keyname=self.key_name,
                                   keyalgorithm=self.key_algorithm)
        if desired.values:
            update.replace(target.name, desired.ttl_s, target.rdtype, *desired.values)
        else:
            update.delete(target.name, target.rdtype)
        try:
            response = dns.query.tcp(update, self.server, port=self.port, timeout=self.io_timeout_s)
        except dns.tsig.PeerError as exc:  # BADSIG, BADKEY, BADTIME: the server refused our key
            raise DriverRejected(f"{self.server}:{self.port} refused the TSIG key "
                                 f"{self.key_name}: {type(exc).__name__}") from exc
        except (dns.exception.Timeout, OSError, EOFError) as exc:
            raise DriverUnavailable(f"DNS UPDATE to {self.server}:{self.port} failed: {exc!r}") from exc
        rcode = response.rcode()
        if rcode != dns.rcode.NOERROR:
            raise DriverRejected(f"{self.server}:{self.port} answered {dns.rcode.to_text(rcode)} "
                                 f"to the UPDATE of {target.name} {target.rdtype} in {target.zone}")


class Route53Driver(_DnsPolling):
    """Route 53 record sets through boto3 (`client` may point at moto's server in tests)."""

    def __init__(self, client: Any, *, clock: Clock | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(clock=clock, sleep=sleep)
        self.client = client
        self._zone_ids: dict[str, str] = {}
        self._pending: dict[DnsTarget, str] = {}  # target -> change id not yet INSYNC

    def _call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

        try:
            return getattr(self.client, operation)(**kwargs)
        except EndpointConnectionError as exc:
            raise DriverUnavailable(f"route53 {operation}: {exc}") from exc
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("Throttling", "PriorRequestNotComplete", "ServiceUnavailable"):
                raise DriverUnavailable(f"route53 {operation}: {code}") from exc
            raise DriverRejected(f"route53 {operation}: {code}: {exc}") from exc
        except BotoCoreError as exc:
            raise DriverUnavailable(f"route53 {operation}: {exc}") from exc

    def _zone_id(self, zone: str) -> str:
        if zone not in self._zone_ids:
            zones = self._call("list_hosted_zones_by_name", DNSName=zone, MaxItems="1")["HostedZones"]
            if not zones or zones[0]["Name"] != zone:
                raise DriverRejected(f"route53 has no hosted zone {zone}")
            self._zone_ids[zone] = zones[0]["Id"].rsplit("/", 1)[-1]
        return self._zone_ids[zone]

    def _record_set(self, target: DnsTarget) -> dict[str, Any] | None:
        page = self._call("list_resource_record_sets", HostedZoneId=self._zone_id(target.zone),
                          StartRecordName=target.name, StartRecordType=target.rdtype, MaxItems="1")
        for record_set in page["ResourceRecordSets"]:
            if record_set["Name"] == target.name and record_set["Type"] == target.rdtype:
                return record_set
        return None

    @retry_unavailable()
    def observe(self, target: DnsTarget) -> tuple[DnsState, str]:  # type: ignore[override]
        change_id = self._pending.get(target)
        if change_id is not None:
            status = self._call("get_change", Id=change_id)["ChangeInfo"]["Status"]
            if status != "INSYNC":
                replaced = self._replaced[target]
                return replaced, f"route53 change {change_id} {status}: authoritative servers still serve {replaced.values}"
            del self._pending[target]
        record_set = self._record_set(target)
        if record_set is None:
            return DnsState(target=target, values=(), ttl_s=0), f"route53 {target.name} {target.rdtype}: no record set"
        values = tuple(sorted(r["Value"] for r in record_set.get("ResourceRecords", [])))
        state = DnsState(target=target, values=values, ttl_s=int(record_set.get("TTL", 0)))
        return state, f"route53 {target.name} {record_set.get('TTL')} {target.rdtype} {' '.join(values)} (INSYNC)"

    @retry_unavailable()
    def _write(self, desired: DnsState) -> None:  # type: ignore[override]
        target = desired.target
        current = self._record_set(target)
        self._replaced[target] = DnsState(
            target=target, values=tuple(sorted(r["Value"] for r in (current or {}).get("ResourceRecords", []))),
            ttl_s=int((current or {}).get("TTL", 0)))
        if desired.values:
            change = {"Action": "UPSERT", "ResourceRecordSet": {
                "Name": target.name, "Type": target.rdtype, "TTL": desired.ttl_s,
                "ResourceRecords": [{"Value": v} for v in desired.values]}}
        elif current is not None:
            change = {"Action": "DELETE", "ResourceRecordSet": current}
        else:
            return  # already absent
        info = self._call("change_resource_record_sets", HostedZoneId=self._zone_id(target.zone),
                          ChangeBatch={"Comment": "lifeline cutover", "Changes": [change]})["ChangeInfo"]
        if info["Status"] != "INSYNC":
            self._pending[target] = info["Id"]
