"""The dns tier: move a region's records on an authoritative server.

Region faults are cut over here (30 s – 5 min). The seed's dual TTL (§4),
one `DnsTarget` with two names:

- `name`, the external record clients resolve, short TTL (`ttl_s`, 60 s):
  a cutover takes effect for clients within a minute of the write.
  `Verification.client_cache_ttl_s` is the TTL of the answer it replaced,
  the time resolvers may keep serving the old region: the cutover's figure.
- `internal_name` (optional), the record the region's own services
  resolve, long TTL (`internal_ttl_s`, 600 s): a DNS outage leaves their
  resolution working for up to 600 s after their last answer.

A region cutover repoints the internal record too, in the same UPDATE
(Route 53: change batch), which the server applies all or nothing. Left
alone, it would send every internal caller to the region that is out for
as long as the cutover lasts, with no bound; moved, internal callers follow
within its TTL, reported as `Verification.internal_cache_ttl_s`: they may
keep the previous answer up to 600 s after the cutover. That is the
internal recovery time and is not the cutover's: the external record's
60 s is what clients see. Neither "out" nor "in" deletes the internal
record (every region's answer is non-empty), so it stays resolvable through
a DNS outage that starts during a cutover. Both records are read back from
the server, TTL included, before a step verifies; rollback restores both
as recorded.

Two drivers, one `DnsState`:

- `Rfc2136Driver`: RFC 2136 UPDATE signed with TSIG (dnspython) over TCP to
  the primary, read back with a UDP query per name to the same
  authoritative server. Replace is one UPDATE (delete each RRset, add the
  new one) and idempotent, so it is retried when the server cannot be
  reached; BADSIG/BADKEY, NOTAUTH and REFUSED are refusals and are not.
  Measured on BIND 9.18 on loopback: the answer changes ~1 ms after the
  UPDATE's reply.
- `Route53Driver`: `ChangeResourceRecordSets` UPSERT through boto3, read back
  through `ListResourceRecordSets`. Route 53 answers PENDING until every
  authoritative server has the change; until `GetChange` says INSYNC the
  driver reports the records it replaced, so `verify` waits for INSYNC.
  Tested against moto's server (an emulator: no DNS server behind it).

A cutover's target names its scope (`DnsTarget.scope`, which decides the
answer "out" means). Neither driver sends it, and each keys what it knows
of a record (the answer it replaced, a pending change) by the record alone
(`DnsTarget.record()`); the states it reads back carry the target it was
given, scope included, so they compare equal to the step's.
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
from contract.routing_tier import RoutingTier
from cutover.drivers.base import (
    DnsRecordSet,
    DnsState,
    DnsTarget,
    DriverRejected,
    DriverUnavailable,
)
from cutover.drivers.polling import PollingDriver, retry_unavailable


class _DnsPolling(PollingDriver[DnsState]):
    tier = RoutingTier.DNS

    def __init__(self, *, clock: Clock | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(clock=clock, sleep=sleep)
        self._replaced: dict[DnsTarget, DnsState] = {}  # by `target.record()`: what the server held before a write

    def client_cache_ttl_s(self, expected: DnsState) -> int | None:
        replaced = self._replaced.get(expected.target.record())
        if replaced is not None and replaced.values and replaced.values != expected.values:
            return replaced.ttl_s
        return expected.ttl_s

    def internal_cache_ttl_s(self, expected: DnsState) -> int | None:
        if expected.internal_values is None:
            return None  # the target has no internal record
        replaced = self._replaced.get(expected.target.record())
        if replaced is not None and replaced.internal_values and replaced.internal_values != expected.internal_values:
            return replaced.internal_ttl_s
        return expected.internal_ttl_s


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
        answers = [self._query(name, target.rdtype) for name in target.names()]
        return (DnsState.from_record_sets(target, [record_set for record_set, _ in answers]),
                " | ".join(evidence for _, evidence in answers))

    def _query(self, name: str, rdtype: str) -> tuple[DnsRecordSet, str]:
        query = dns.message.make_query(name, rdtype)
        query.flags &= ~dns.flags.RD  # an authoritative answer, not a resolver's
        try:
            answer = dns.query.udp(query, self.server, port=self.port, timeout=self.io_timeout_s)
        except (dns.exception.Timeout, OSError) as exc:
            raise DriverUnavailable(f"DNS query to {self.server}:{self.port} failed: {exc!r}") from exc
        rcode = answer.rcode()
        if rcode not in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN):
            raise DriverRejected(f"{self.server}:{self.port} answered {dns.rcode.to_text(rcode)} "
                                 f"for {name} {rdtype}")
        rrset = answer.get_rrset(answer.answer, dns.name.from_text(name), dns.rdataclass.IN,
                                 dns.rdatatype.from_text(rdtype))
        aa = "aa" if answer.flags & dns.flags.AA else "not-aa"
        if rrset is None:
            return (DnsRecordSet(name, (), 0),
                    f"@{self.server}:{self.port} {name} {rdtype}: {dns.rcode.to_text(rcode)} ({aa})")
        return (DnsRecordSet(name, tuple(sorted(r.to_text() for r in rrset)), rrset.ttl),
                f"@{self.server}:{self.port} ({aa}) " + rrset.to_text().replace("\n", "; "))

    def _write(self, desired: DnsState) -> None:  # type: ignore[override]
        replaced = self.read_state(desired.target)
        self._send_update(desired)
        self._replaced[desired.target.record()] = replaced

    @retry_unavailable()
    def _send_update(self, desired: DnsState) -> None:
        target = desired.target
        update = dns.update.Update(target.zone, keyring=self.keyring, keyname=self.key_name,
                                   keyalgorithm=self.key_algorithm)
        for record_set in desired.record_sets():  # one UPDATE: the server applies all of it or none
            if record_set.values:
                update.replace(record_set.name, record_set.ttl_s, target.rdtype, *record_set.values)
            else:
                update.delete(record_set.name, target.rdtype)
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
        self._pending: dict[DnsTarget, str] = {}  # target.record() -> change id not yet INSYNC

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

    def _record_set(self, target: DnsTarget, name: str) -> dict[str, Any] | None:
        page = self._call("list_resource_record_sets", HostedZoneId=self._zone_id(target.zone),
                          StartRecordName=name, StartRecordType=target.rdtype, MaxItems="1")
        for record_set in page["ResourceRecordSets"]:
            if record_set["Name"] == name and record_set["Type"] == target.rdtype:
                return record_set
        return None

    @staticmethod
    def _read_back(name: str, record_set: dict[str, Any] | None) -> DnsRecordSet:
        if record_set is None:
            return DnsRecordSet(name, (), 0)
        return DnsRecordSet(name, tuple(sorted(r["Value"] for r in record_set.get("ResourceRecords", []))),
                            int(record_set.get("TTL", 0)))

    @retry_unavailable()
    def observe(self, target: DnsTarget) -> tuple[DnsState, str]:  # type: ignore[override]
        record = target.record()
        change_id = self._pending.get(record)
        if change_id is not None:
            status = self._call("get_change", Id=change_id)["ChangeInfo"]["Status"]
            if status != "INSYNC":
                replaced = self._replaced[record].model_copy(update={"target": target})
                return replaced, f"route53 change {change_id} {status}: authoritative servers still serve {replaced.values}"
            del self._pending[record]
        found = [self._read_back(name, self._record_set(target, name)) for name in target.names()]
        evidence = " | ".join(f"route53 {r.name} {r.ttl_s} {target.rdtype} {' '.join(r.values)} (INSYNC)" if r.values
                              else f"route53 {r.name} {target.rdtype}: no record set" for r in found)
        return DnsState.from_record_sets(target, found), evidence

    @retry_unavailable()
    def _write(self, desired: DnsState) -> None:  # type: ignore[override]
        target = desired.target
        current = {name: self._record_set(target, name) for name in target.names()}
        self._replaced[target.record()] = DnsState.from_record_sets(
            target, [self._read_back(name, record_set) for name, record_set in current.items()])
        changes: list[dict[str, Any]] = []
        for record_set in desired.record_sets():  # one change batch: Route 53 applies all of it or none
            if record_set.values:
                changes.append({"Action": "UPSERT", "ResourceRecordSet": {
                    "Name": record_set.name, "Type": target.rdtype, "TTL": record_set.ttl_s,
                    "ResourceRecords": [{"Value": v} for v in record_set.values]}})
            elif current[record_set.name] is not None:
                changes.append({"Action": "DELETE", "ResourceRecordSet": current[record_set.name]})
        if not changes:
            return  # already absent
        info = self._call("change_resource_record_sets", HostedZoneId=self._zone_id(target.zone),
                          ChangeBatch={"Comment": "lifeline cutover", "Changes": changes})["ChangeInfo"]
        if info["Status"] != "INSYNC":
            self._pending[target.record()] = info["Id"]
