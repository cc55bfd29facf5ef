"""A version's canary: the greedy output of a verified instance for a fixed prompt, kept in the catalog.

Recorded with `lifeline catalog canary record MODEL VERSION --url ENGINE`
(`contract.canary.record_from_engine` asks the engine), or inherited from
another version that must answer alike (`lifeline catalog canary inherit
MODEL VERSION --from OTHER`: the same weights re-exported), carried to every
agent on the snapshot's `VersionEntry.canary`, and checked by each agent's
canary probe (token count, output, time to first token).

"Verified" is checked here, not taken on trust: the engine must serve the
version (`/healthz/generation` names it; a stock vLLM's `/v1/models`) with
the catalog's weights digest (the shards `register` hashed; for a stock vLLM,
which cannot report one, the digest of the files it was started from, hashed
by the recorder: `contract.canary.stock_vllm_source`), and the version's last
verify must not have failed. A record from a corrupted engine would eject every healthy one.
A version has one record; replacing it is asked for explicitly, and both
write an event and advance the snapshot (the canary is in it).

When an agent reports that a version failed its canary everywhere
(`rollback_failed_canary`), the non-prod alias naming it moves back one step
through the aliases' own rollback.
"""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.orm import Session

from common.clock import Clock
from contract.canary import CanaryNotRecorded, CanaryRecord, CanarySource
from contract.identity import weights_digest
from controlplane.errors import InvalidInput
from controlplane.event import service as event_service
from controlplane.routing_version import service as routing_version
from weight_catalog import repository
from weight_catalog.aliases import PROD, rollback
from weight_catalog.errors import (
    AliasConflict,
    AliasNotFound,
    AutomaticRollbackRefused,
    CanaryEngineUnverified,
    CanaryExists,
    FingerprintMismatch,
    LastVerifyFailed,
    NoCanaryToInherit,
)
from weight_catalog.models import AliasMove, WeightVersion
from weight_catalog.service import get_version_or_raise


def catalog_digest(session: Session, weight_version: WeightVersion) -> str:
    """The weights digest an engine serving this version reports (contract.identity.weights_digest)."""
    return weights_digest(repository.shard_digests_by_version(session, {weight_version.id}).get(weight_version.id, {}))


def check_engine(session: Session, *, weight_version: WeightVersion, engine: CanarySource) -> None:
    """Refuse an engine that is not a verified instance of the version (CanaryEngineUnverified, 409)."""
    label = f"{weight_version.model} {weight_version.version}"
    if engine.model != weight_version.version:
        raise CanaryEngineUnverified(f"engine {engine.instance} serves {engine.model!r}, not {label}")
    expected = catalog_digest(session, weight_version)
    if engine.weights_digest != expected:
        hashed = "" if engine.digest_from == "engine" else " (of the files it was started from)"
        raise CanaryEngineUnverified(f"engine {engine.instance}'s weights digest{hashed} {engine.weights_digest[:23]}… is "
                                     f"not the catalog's {expected[:23]}… for {label}: its weights differ from the "
                                     "registered artifact (corrupt, or another build)")
    if weight_version.last_verify_healthy is False:
        raise LastVerifyFailed(f"{label}'s last verify failed; verify it again before recording its canary")


def agreed(records: list[CanaryRecord], instances: list[str]) -> CanaryRecord:
    """The one record every instance gave (the first's), or CanaryNotRecorded naming the first that differs."""
    first = records[0]
    compared = first.compare_tokens or len(first.output_token_ids)
    for other, instance in zip(records[1:], instances[1:], strict=True):
        if other.output_token_ids[:compared] != first.output_token_ids[:compared]:
            raise CanaryNotRecorded(f"{instance} answered {other.output_token_ids}, {instances[0]} "
                                    f"{first.output_token_ids}: the instances disagree, so at least one is not sound; "
                                    "record from instances that agree")
    return first


def record(session: Session, *, model: str, version: str, canary: CanaryRecord, engines: list[CanarySource],
           actor: str, clock: Clock, replace: bool = False) -> WeightVersion:
    """Keep `canary` (what every one of `engines` answered) as the version's record; an event; the snapshot advances."""
    weight_version = get_version_or_raise(session, model=model, version=version)
    if not engines:
        raise InvalidInput("a canary is recorded from at least one verified instance", param="engines")
    for engine in engines:
        check_engine(session, weight_version=weight_version, engine=engine)
    return _keep(session, weight_version, canary, actor=actor, clock=clock, replace=replace,
                 reason=f"greedy output of {', '.join(e.instance for e in engines)} "
                        f"({len(canary.output_token_ids)} tokens)",
                 source={"recorded_from": [e.instance for e in engines], "weights_digest": engines[0].weights_digest,
                         "digest_from": sorted({e.digest_from for e in engines})})


def inherit(session: Session, *, model: str, version: str, from_version: str, actor: str, clock: Clock,
            replace: bool = False) -> WeightVersion:
    """Keep `from_version`'s record as `version`'s: `version` must answer the canary as `from_version` does.

    For a version released as the same weights in a new artifact (a re-export, a re-shard, a format
    conversion): its greedy output on the canary prompt must not change, so what it is checked against is the
    known-good version's answer, not whatever the new artifact happens to answer. The source must have a
    record and both the same semantic fingerprint (the prompt's token ids mean the same only under the same
    tokenizer and template); anything else is refused and changes nothing.
    """
    weight_version = get_version_or_raise(session, model=model, version=version)
    source = get_version_or_raise(session, model=model, version=from_version)
    if source.id == weight_version.id:
        raise InvalidInput("a version cannot inherit its own canary", param="from_version")
    canary = canary_of(source)
    if canary is None:
        raise NoCanaryToInherit(f"{model} {from_version} has no canary recorded to inherit")
    if source.fingerprint != weight_version.fingerprint:
        raise FingerprintMismatch(f"{model} {version} and {from_version} differ in semantic fingerprint: the "
                                  "canary prompt's token ids would not mean the same to both")
    if weight_version.last_verify_healthy is False:
        raise LastVerifyFailed(f"{model} {version}'s last verify failed; verify it again before giving it a canary")
    return _keep(session, weight_version, canary, actor=actor, clock=clock, replace=replace,
                 reason=f"inherited from {from_version}: {version} must answer the canary as {from_version} does",
                 source={"inherited_from": from_version})


def _keep(session: Session, weight_version: WeightVersion, canary: CanaryRecord, *, actor: str, clock: Clock,
          replace: bool, reason: str, source: dict) -> WeightVersion:
    model, version = weight_version.model, weight_version.version
    before = weight_version.canary
    if before is not None and not replace:
        raise CanaryExists(f"{model} {version} has a canary recorded at {weight_version.canary_recorded_at} by "
                           f"{weight_version.canary_recorded_by}; pass --replace (replace=true) to record another")
    # Compare-and-set on the record we read: of two concurrent records, one wins and the other is refused.
    expected = WeightVersion.canary_recorded_at.is_(None) if weight_version.canary_recorded_at is None else \
        WeightVersion.canary_recorded_at == weight_version.canary_recorded_at
    result = session.execute(
        update(WeightVersion).where(WeightVersion.id == weight_version.id, expected)
        .values(canary=canary.model_dump(mode="json"), canary_recorded_at=clock.utcnow(), canary_recorded_by=actor)
        .execution_options(synchronize_session=False))
    session.refresh(weight_version)
    if result.rowcount != 1:
        raise CanaryExists(f"{model} {version}'s canary was recorded by {weight_version.canary_recorded_by} "
                           "meanwhile; read it and record again with --replace if it is wrong")
    event_service.record(
        session, kind="catalog.canary.record", actor=actor, clock=clock, reason=reason,
        scope=f"model:{model}/version:{version}",
        before={"output_token_ids": before["output_token_ids"]} if before else {},
        after={"output_token_ids": canary.output_token_ids, "prompt_token_ids": canary.prompt_token_ids,
               "compare_tokens": canary.compare_tokens, **source})
    routing_version.bump(session, clock=clock)  # the snapshot carries the record
    return weight_version


def canary_of(weight_version: WeightVersion) -> CanaryRecord | None:
    """The stored record, as the contract's type (for the snapshot and reads)."""
    return CanaryRecord.model_validate(weight_version.canary) if weight_version.canary else None


def rollback_failed_canary(
    session: Session,
    *,
    model: str,
    alias: str,
    version: str,
    expected_revision: int,
    evidence: str,
    actor: str,
    clock: Clock,
) -> AliasMove:
    """A regional agent saw `version`, which `alias` points at, fail its canary: move the alias back one step.

    The automatic half of a bad rollout (the agent decides *that* the version
    failed, warm_pool/canary_rollback.py; this decides *whether* the alias
    moves). Refused for `prod` (AutomaticRollbackRefused): prod's version is
    what the warm pools run, and taking it away is an operator's cutover, not
    an agent's. Only while the alias still points at `version` at
    `expected_revision`, the revision the agent read in its snapshot: a
    second report of the same failure (another region, a retry) finds it
    moved and changes nothing (AliasConflict). The rollback itself is the
    catalog's one call, with its guards and its `alias.rollback` event.
    """
    if alias == PROD:
        raise AutomaticRollbackRefused(f"alias {PROD!r} of {model!r} is never rolled back automatically: a failing "
                                       "prod version is cut over by an operator")
    current = repository.get_alias(session, model=model, name=alias, for_update=True)
    if current is None:
        raise AliasNotFound(f"model {model!r} has no alias {alias!r}")
    held = session.get(WeightVersion, current.version_id)
    if held is None or held.version != version or current.revision != expected_revision:
        raise AliasConflict(
            f"alias {alias!r} of {model!r} is at revision {current.revision} on "
            f"{held.version if held else '?'}, not {expected_revision} on {version}: it moved since the canary "
            "failed; nothing to do")
    return rollback(session, model=model, alias=alias, actor=actor, clock=clock,
                    reason=f"canary failed on {version}: {evidence}"[:2000], expected_revision=expected_revision)
