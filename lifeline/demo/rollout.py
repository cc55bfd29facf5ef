"""A bad weight version promoted to `canary`, a cohort routed to it: the agent's canary catches it, the alias rolls back.

The bad version is `tiny-seed1`: the tiny model built from another seed,
released as if it were a re-export of prod's `tiny-seed0` (same tokenizer,
template and config, so the same semantic fingerprint; its own files and
checksums, which verify clean). Its canary is inherited from tiny-seed0
(`lifeline catalog canary inherit`): a re-export must answer the canary
prompt as the version it re-exports. Everything the catalog checks at
promote time passes; only its output is wrong.

The scenario, each step through Lifeline's own surfaces:

    deploy      (`CanaryDeployment`, while the fleet starts) tiny-seed1 registered, tiny-seed0's
                canary inherited, one engine of it started in the region with its own lease,
                as a rollout tool deploys a canary before it moves traffic: outside the agent's
                warm pool, which runs prod's version only; no alias names it yet, so nothing
                routes to it and the agent holds it `old_generation`
    catalog     promote tiny-seed1 to `canary` (the canary alias tracked prod until now): the
                fault, from which detection and recovery are measured
    mesh        `PUT /api/v1/mesh-routes`: requests with `X-Lifeline-Cohort: canary` go
                to tiny-seed1; a flow of such requests starts at once
    agent       its canary of the new instance answers wrong_output: the verdict ejects
                the instance, and since every instance of tiny-seed1 failed, the agent
                posts the failure to the catalog (warm_pool/canary_rollback.py), which rolls
                `canary` back to tiny-seed0 (one call, an `alias.rollback` event); the
                cohort is then served by prod's version again

The row counts what the cohort was served wrong (every answer compared
token by token with the reference) and what it was refused. The demo then
removes the route and stops the engine, as the rollout tool would.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controlplane.event.dataplane import is_wrong_output_verdict
from lifeline.demo.fleet import MODEL, STEP_STALL_BOUND_S, DemoFleet
from lifeline.demo.scenarios import (
    EVENT_FLUSH_S,
    Context,
    Row,
    Traffic,
    count,
    events_since,
    fmt,
    last_event_id,
    tiered,
    wait_until,
)
from lifeline.processes import EngineProcess, free_port

BAD_VERSION = "tiny-seed1"
BAD_SEED = 1
COHORT = "canary"


def _aliases(ctx: Context) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in ctx.fleet.api("GET", f"/catalog/models/{MODEL}/aliases").json()}


def _promote(ctx: Context, alias: str, version: str, reason: str) -> dict[str, Any]:
    return ctx.fleet.api("POST", f"/catalog/models/{MODEL}/aliases/{alias}/promote",
                         json={"version": version, "reason": reason}).json()


class CanaryDeployment:
    """tiny-seed1 in the catalog (its canary inherited) and one engine of it in `region`, prepared in the background.

    Started while the fleet starts (the engine's interpreter and torch take tens of seconds to load on a
    loaded two-core machine); `inherit()` gives it prod's canary once that is recorded; `ready()` waits for
    both; `stop()` SIGTERMs the engine (the fleet's close also sweeps every engine under the work dir).
    """

    def __init__(self, fleet: DemoFleet, region: str, zone: str, model_dir: Path) -> None:
        self.fleet, self.region, self.zone, self.model_dir = fleet, region, zone, model_dir
        instance_id = f"{region}-{COHORT}-1"
        self.engine = EngineProcess(
            model=model_dir, port=free_port(), instance_id=instance_id,
            state_dir=fleet.workdir / "state" / instance_id, log_path=fleet.logs / f"engine-{COHORT}.log",
            extra_args=["--served-model-name", BAD_VERSION, "--zone", zone, "--region", region,
                        "--registry", f"{fleet.registry_url}?key_prefix={fleet.registry_prefix}",
                        "--step-stall-bound", str(STEP_STALL_BOUND_S)])
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._prepare, name="demo-canary-deployment", daemon=True)

    def start(self) -> CanaryDeployment:
        self.engine.state_dir.mkdir(parents=True, exist_ok=True)
        self.engine.start()
        self._thread.start()
        return self

    def _prepare(self) -> None:
        try:
            self.fleet.controlplane.cli("catalog", "register", MODEL, BAD_VERSION, str(self.model_dir))
        except BaseException as exc:  # noqa: BLE001 - raised by ready()
            self.error = exc

    def inherit(self) -> None:
        """Once prod's canary is recorded: tiny-seed1 must answer it too (in the background, after the register)."""
        registered = self._thread

        def run() -> None:
            registered.join(timeout=120)
            if self.error is not None:
                return
            try:
                self.fleet.controlplane.cli("catalog", "canary", "inherit", MODEL, BAD_VERSION, "--from",
                                            self.fleet.model_dir.name)
            except BaseException as exc:  # noqa: BLE001 - raised by ready()
                self.error = exc

        self._thread = threading.Thread(target=run, name="demo-canary-inherit", daemon=True)
        self._thread.start()

    def ready(self) -> None:
        self._thread.join(timeout=120)
        if self.error is not None:
            raise self.error
        self.engine.wait_ready(timeout=120)

    def stop(self) -> None:
        if self.engine.process is not None and self.engine.process.poll() is None:
            self.engine.process.send_signal(signal.SIGTERM)


def bad_canary(ctx: Context, deployment: CanaryDeployment) -> Row:
    fleet, region = ctx.fleet, ctx.region
    prod = fleet.model_dir.name
    engine = deployment.engine
    deployment.ready()
    first = last_event_id(fleet)
    if COHORT not in _aliases(ctx):
        _promote(ctx, COHORT, prod, "the canary alias tracks prod between rollouts")
    # The fault: the bad version is the canary alias's from this moment.
    fault_at, wall = time.monotonic(), datetime.now(UTC)
    promoted = _promote(ctx, COHORT, BAD_VERSION, f"demo: roll out {BAD_VERSION} (a re-export of {prod}) to the "
                                                  f"{COHORT} cohort")
    cohort = Traffic(f"{region.name}/{COHORT}", region.gateway.url, ctx.traffic.reference,
                     headers={"X-Lifeline-Cohort": COHORT})
    routed = False
    try:
        fleet.api("PUT", "/mesh-routes", json={
            "model": MODEL, "region": region.name, "cohort": COHORT, "reason": f"demo: the {COHORT} cohort to "
            f"{BAD_VERSION}", "destinations": [{"version": BAD_VERSION, "weight": 100}]})
        routed = True
        cohort.start()
        rolled_at: float | None = None
        served_at: float | None = None
        try:  # a rollback that never comes is this row's broken promise, not the run's end
            rolled_at = wait_until(lambda: _aliases(ctx)[COHORT]["version"] == prod and time.monotonic(),
                                   f"the {COHORT} alias back on {prod}", 60)
            served_at = wait_until(lambda: cohort.served_correctly_after(rolled_at),
                                   f"the {COHORT} cohort served by {prod} again", 30)
            time.sleep(1.0)  # a little more of the cohort on prod
        except TimeoutError:
            pass
    finally:
        cohort.stop()
        if routed:
            try:
                fleet.api("DELETE", "/mesh-routes", params={"model": MODEL, "region": region.name, "cohort": COHORT,
                                                            "reason": f"demo: {BAD_VERSION} rolled back"})
            except RuntimeError:
                pass  # reported by the row: the route is listed in the events
        deployment.stop()  # as the rollout tool retires a rolled-back canary
    ended = time.monotonic()

    def verdict_seen() -> list[dict[str, Any]] | None:
        found = [e for e in events_since(fleet, first) if is_wrong_output_verdict(e, engine.instance_id)]
        return found or None

    try:
        verdicts = wait_until(verdict_seen, f"{engine.instance_id}'s wrong_output verdict in the log", EVENT_FLUSH_S)
    except TimeoutError:
        verdicts = []
    events = events_since(fleet, first)
    rollback = next((e for e in events if e["kind"] == "alias.rollback" and e["scope"].endswith(f"alias:{COHORT}")),
                    None)
    wrong = cohort.wrong(fault_at, ended)
    refused = cohort.lost(fault_at, ended)
    why = sorted({_error_type(r.error) for r in cohort.between(fault_at, ended) if r.error})
    row = Row(f"bad version on {COHORT} ({BAD_VERSION})", f"{BAD_VERSION} (another build, released as a re-export of "
              f"{prod}) promoted to {COHORT}; the {COHORT} cohort routed to it")
    row.fault_at, row.ended_at = fault_at, ended
    verdict_at = _at(verdicts[0]) if verdicts else None
    row.detection_s = None if verdict_at is None else (verdict_at - wall).total_seconds()
    row.rto_latency_s = cohort.rto_latency(fault_at, ended)
    row.token_rpo = sum(sum(1 for a, b in zip(r.token_ids, ctx.traffic.reference) if a != b) for r in wrong)
    steady_lost = ctx.traffic.lost(fault_at, ended)
    row.requests_lost = refused + steady_lost
    row.tiers = tiered(events)
    by_agent = rollback is not None and "agent" in rollback["actor"] + str(rollback.get("reason"))
    row.ok = (rollback is not None and by_agent and _aliases(ctx)[COHORT]["version"] == prod and steady_lost == 0
              and bool(verdicts) and served_at is not None)
    reason = str((verdicts[0].get("reason") if verdicts else "") or "no wrong_output verdict seen")[:110]
    row.line = (f"{BAD_VERSION} promoted to {COHORT} (revision {promoted['revision']}; its canary inherited from "
                f"{prod}; one engine of it deployed in {deployment.zone}) and the {COHORT} cohort routed to it by a "
                f"mesh route: the agent's canary failed it ({reason}) {fmt(row.detection_s)} after the promotion; "
                + (f"{rollback['actor']} rolled {COHORT} back {rollback['before']['version']} → "
                   f"{rollback['after']['version']} {fmt(None if rolled_at is None else rolled_at - fault_at)} after; "
                   if rollback else
                   f"{COHORT} was never rolled back; ")
                + f"the cohort got {len(cohort.runs)} answers: {len(wrong)} served wrong ({row.token_rpo} tokens), "
                f"{count(refused)} refused{' (' + ', '.join(why) + ')' if why else ''}, the rest right; served by "
                f"{prod} again {fmt(None if served_at is None else served_at - fault_at)} after the fault "
                f"(RTO_latency {fmt(row.rto_latency_s)}: TTFT p99 back within target)")
    return row


def _error_type(error: str | None) -> str:
    """The stable error type in a refused request's error (the gateway's `{"error": {"type": …}}`), else its start."""
    found = re.search(r"""['"]type['"]: ['"]([A-Za-z_]+)['"]""", error or "")
    status = re.search(r"Error code: (\d{3})", error or "")
    return found[1] if found else f"HTTP {status[1]}" if status else (error or "")[:40]


def _at(event: dict[str, Any]) -> datetime:
    at = datetime.fromisoformat(str(event["started_at"]).replace("Z", "+00:00"))
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
