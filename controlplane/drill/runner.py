"""Runs a drill on a fleet: steady traffic, one fault inside the blast radius, measure, report.

What each fault does, touches and alone measures is `controlplane/drill/faults.py`
(instance faults below, zone loss, control plane down, Redis down); this
module is what every drill shares.

Promise measured: request recovery and semantic recovery (ARCHITECTURE "three
promises"). Steady synthetic streaming traffic goes through the gateway with
the official `openai` client, alternating greedy and seeded requests, each
compared token by token with an undisturbed run made just before. The fault
lands once `traffic.fault_after_tokens` tokens have reached the client, on
one instance the blast radius names:

    sigkill          the fleet kills the process (SIGKILL; the pool driver in production)
    sigstop          the fleet stops the engine (SIGSTOP; stock vLLM: its engine core), SIGCONT to undo
    hang             the engine's fault admin: POST /admin/faults {"hang_after_tokens": now}
    corrupt_weights  the engine's fault admin: POST /admin/faults {"corrupt_weights": true}
    bad_version      the fleet starts it again from another version's weights under the same name

Lifeline recovers on its own (the gateway migrates the streams); the runner
only watches. Stop conditions (error rate, TTFT p99) are checked every time a
request finishes; one crossed stops the traffic, rolls the fault back
(faults cleared; a stopped engine continued; a killed or corrupted instance
restarted) and aborts the run.
After the traffic, the fault is rolled back the same way, a canary (the
greedy request, straight to each instance) measures RTO_quality, the
`routing.tier` events written since the drill began are read back in order,
and the run ends `passed` or `failed` with its report
(controlplane/drill/report_builder.py).

A fault target outside the blast radius is refused before anything is
touched (`OutsideBlastRadius`), and the run is aborted with that reason.

Where the fleet resolves its gateway (`Fleet.resolve_gateway`: a region
drill's DNS name, asked of the authoritative server), every attempt asks it
again; with `traffic.retry_for_s` a broken request is sent again from
scratch, as a client would after its connection broke
(controlplane/drill/traffic.py).

Each state change is its own unit of work (commit per step, like cutover
flows), so `GET /api/v1/drills/runs/{id}` shows `running` while traffic flows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from common.clock import Clock
from common.logs import get_logger
from common import oneshot_http
from controlplane.db import session_scope
from controlplane.drill import faults, measure, metrics, service
from controlplane.drill.engines import evidence as engine_evidence
from controlplane.drill.engines import instance_generation
from controlplane.drill.errors import ApprovalRequired, OutsideBlastRadius, UnsupportedDrill
from controlplane.drill.faults import check_blast_radius
from controlplane.drill.measure import RequestTrace
from controlplane.drill.report_builder import DrillReportBuilder
from controlplane.drill.schemas import BlastRadius, StopConditions, Targets, Traffic
from controlplane.drill.states import DrillFault, DrillRunEvent, DrillRunState, DrillScope, may_start
from controlplane.drill.traffic import DrillTraffic, LiveTraffic, chat_messages

log = get_logger(__name__)

RUNNER_ACTOR = "drill-runner"
RECOMPUTED = "lifeline_gateway_recomputed_decode_tokens_total"


class Fleet(Protocol):
    """The serving fleet a drill acts on: local processes here, the pool driver in production."""

    gateway_url: str

    def instance_ids(self) -> list[str]: ...

    def engine_url(self, instance_id: str) -> str: ...

    def served_model(self, instance_id: str) -> str:
        """The model name the engine itself answers to (for the canary, sent straight to it)."""

    def kill(self, instance_id: str) -> None:
        """SIGKILL the instance's process."""

    def restart(self, instance_id: str) -> None:
        """Bring the instance back (new generation) and wait until it is routable again."""

    # sigstop drills also need `stop(instance_id)` (SIGSTOP the engine: stock vLLM's engine core) and
    # `resume(instance_id)` (SIGCONT); a fleet without them is refused such a drill (faults.plan_fault).


class EventReader(Protocol):
    def last_id(self) -> int: ...

    def events_after(self, after_id: int) -> list[dict[str, Any]]: ...


class HttpEventReader:
    """Reads the control plane's event log over GET /api/v1/events (viewer token)."""

    def __init__(self, controlplane_url: str, token: str, *, timeout: float = 5.0) -> None:
        self.url = controlplane_url.rstrip("/") + "/api/v1/events"
        self.headers = {"Authorization": f"Bearer {token}"}
        self.timeout = timeout

    def _page(self, after_id: int) -> list[dict[str, Any]]:
        response = oneshot_http.get(self.url, params={"after_id": after_id, "limit": 1000}, headers=self.headers,
                                    timeout=self.timeout)
        response.raise_for_status()
        return sorted(response.json(), key=lambda e: e["id"])

    def last_id(self) -> int:
        return max((e["id"] for e in self.events_after(0)), default=0)

    def events_after(self, after_id: int) -> list[dict[str, Any]]:
        """Every event after `after_id`, oldest first, a page of 1000 at a time."""
        out: list[dict[str, Any]] = []
        while page := self._page(after_id):
            out.extend(page)
            after_id = page[-1]["id"]
        return out


@dataclass
class DrillOutcome:
    run_id: int
    state: DrillRunState
    report: dict[str, Any]


__all__ = ["DrillOutcome", "DrillRunner", "HttpEventReader", "InstanceDrillRunner", "check_blast_radius",
           "stop_condition_tripped"]


def stamp_fault(clock: Clock, inject: Callable[[], object]) -> tuple[float, float, float]:
    """Run the fault's action, then stamp it: (monotonic, wall, seconds the action took).

    The moment the fault took effect is when its action returned (the
    SIGKILLs delivered, the engine's fault admin answered), not when the
    runner decided to send it: stamped before, `detection_s` included the
    runner's own round trips (the hang fault's two admin calls, ~40 ms of
    a reported ~40 ms).
    """
    sent = clock.now()
    inject()
    fault_at, fault_wall = clock.now(), clock.wall()
    return fault_at, fault_wall, fault_at - sent


class DrillRunner:
    """One drill run, start to report. `run()` is blocking (a Celery task or a CLI command calls it).

    The fault itself, its footprint and its own measurements are a
    `faults.FaultPlan`; this class owns what every drill shares: the
    approval check, the undisturbed run, the traffic, the stop conditions,
    the rollback, the canary, the event log and the report. The requests
    themselves are sent by `DrillTraffic` (controlplane/drill/traffic.py);
    the report, with the canary and the event log it reads back, is built by
    `DrillReportBuilder` (controlplane/drill/report_builder.py).
    """

    def __init__(self, *, factory: sessionmaker[Session], fleet: Fleet, clock: Clock,
                 events: EventReader | None = None, model: str | None = None,
                 sleep: Callable[[float], None] = time.sleep, canary_timeout: float = 60.0,
                 report_dir: Any = None) -> None:
        self.factory = factory
        self.fleet = fleet
        self.clock = clock
        self.events = events
        self.model = model
        self.sleep = sleep
        self.canary_timeout = canary_timeout
        self.report_dir = report_dir
        self.streams = DrillTraffic(fleet=fleet, clock=clock, sleep=sleep)  # every request, through the gateway
        # the report, with the RTO_quality canary and the event log it reads back
        self.reports = DrillReportBuilder(fleet=fleet, clock=clock, events=events, sleep=sleep,
                                          canary_timeout=canary_timeout, report_dir=report_dir)

    # -- orchestration ------------------------------------------------------
    def run(self, run_id: int, *, target: str | None = None) -> DrillOutcome:
        with session_scope(self.factory) as session:
            run = service.get_run_or_raise(session, run_id=run_id, fresh=True)
            definition = run.definition
            scope, fault = DrillScope(definition.scope), DrillFault(definition.fault)
            radius = BlastRadius.model_validate(definition.blast_radius)
            stops = StopConditions.model_validate(definition.stop_conditions)
            targets = Targets.model_validate(definition.targets)
            traffic = Traffic.model_validate(definition.traffic)
            model_name = self.model or definition.model
            meta = {"drill": definition.name, "version": definition.version, "run": run.id, "model": definition.model,
                    "scope": scope.value, "fault": fault.value, "region": definition.region,
                    "expected_tier": definition.expected_tier, "blast_radius": radius.model_dump(mode="json"),
                    "stop_conditions": stops.model_dump(mode="json")}
            # Zone and region drills start only once a person approved this run; nothing is touched before.
            if not may_start(scope, approved=run.approved_by is not None):
                raise ApprovalRequired(f"drill run {run.id} is a {scope} drill in state {run.state}: an operator "
                                       "must approve it before it starts")
        try:
            plan = faults.plan_fault(scope=scope, fault=fault, radius=radius, traffic=traffic, fleet=self.fleet,
                                     target=target, clock=self.clock, sleep=self.sleep,
                                     probe=lambda: self.streams.probe(model_name, traffic),
                                     expected_tier=meta["expected_tier"], events=self.events)
            prepare = getattr(plan, "prepare", None)
            if prepare is not None:
                prepare()
        except (OutsideBlastRadius, UnsupportedDrill) as refused:
            with session_scope(self.factory) as session:
                service.abort(session, run_id=run_id, reason=f"refused: {refused}", actor=RUNNER_ACTOR,
                              clock=self.clock)
            metrics.RUNS.labels(scope=scope.value, fault=fault.value, outcome="refused").inc()
            raise
        # Which engines serve, and whether they sample by position (before the fault, while every one answers):
        # the SLO document says "token-identical" only for what this shows (controlplane/drill/engines.py).
        meta["engines"] = engine_evidence(self.fleet, self.fleet.instance_ids())
        # An instance drill's events name the incarnation it faults (the run's fault_generation).
        fault_generation = instance_generation(self.fleet, plan.target) if scope == DrillScope.INSTANCE else None
        meta["fault_generation"] = fault_generation
        with session_scope(self.factory) as session:
            service.start(session, run_id=run_id, fault_target=plan.target, actor=RUNNER_ACTOR, clock=self.clock,
                          fault_generation=fault_generation)

        try:
            outcome = self._drive(run_id, meta, model_name, plan, stops, targets, traffic)
        except Exception as error:
            log.error("drill_failed", run=run_id, error=repr(error))
            plan.clear()
            with session_scope(self.factory) as session:
                run = service.get_run_or_raise(session, run_id=run_id, fresh=True)
                if run.state == DrillRunState.RUNNING:
                    service.advance(session, run=run, event=DrillRunEvent.ERROR, clock=self.clock,
                                    failure=repr(error)[:2000])
            metrics.RUNS.labels(scope=scope.value, fault=fault.value, outcome="error").inc()
            raise
        metrics.RUNS.labels(scope=scope.value, fault=fault.value, outcome=outcome.state.value).inc()
        for metric, value in outcome.report["measured"].items():
            if value is not None:
                metrics.MEASURED.labels(drill=meta["drill"], metric=metric).set(value)
        log.info("drill_ended", run=run_id, state=outcome.state.value, measured=outcome.report["measured"])
        return outcome

    def _drive(self, run_id: int, meta: dict[str, Any], model_name: str, plan: faults.FaultPlan,
               stops: StopConditions, targets: Targets, traffic: Traffic) -> DrillOutcome:
        first_event = self.events.last_id() if self.events is not None else 0
        baselines = {mode: self.streams.baseline(model_name, traffic, mode) for mode in ("greedy", "seeded")}
        expected = {mode: trace.token_ids for mode, trace in baselines.items()}
        baseline_ttft = [t.ttft for t in baselines.values() if t.ttft is not None]
        # Multi-turn sessions: the undisturbed conversation per mode, every turn's ids (turn 0 is `expected`'s
        # prompt as a chat message, so it is a conversation of its own, not the completions baseline).
        conversations = ({mode: self.streams.conversation_baseline(model_name, traffic, mode)
                          for mode in ("greedy", "seeded")}
                         if traffic.multi_turn else {})
        expected_turns = {mode: [t.token_ids for t in turns] for mode, turns in conversations.items()}
        baseline_ttft += [t.ttft for turns in conversations.values() for t in turns if t.ttft is not None]
        engines = faults._Engines(self.fleet)
        slowed = (plan.slow if plan.slow is not None else plan.prefer) if traffic.token_delay_ms else []
        for instance in slowed:
            # Slow the victims' tokens so the fault lands mid-stream; inside the blast radius, rolled back below.
            engines.admin(instance, {"token_delay_ms": traffic.token_delay_ms})
        gateways = faults._gateway_urls(self.fleet)
        # The gateways' own count of decode tokens generated again after a failure (token RPO's recomputed part).
        recomputed_before = faults.gateway_metric(gateways, RECOMPUTED)
        live = LiveTraffic()
        fault_at: float | None = None
        fault_wall: float | None = None
        cleared_at: float | None = None
        tripped: str | None = None

        def one(index: int) -> None:
            if live.stop.is_set():
                return
            if traffic.multi_turn:
                conversation(index)
                return
            mode = "greedy" if index % 2 == 0 else "seeded"
            trace = RequestTrace(index=index, sampling=mode, started_at=self.clock.now())
            with live.lock:
                live.traces.append(trace)
            prefer = plan.prefer[index % len(plan.prefer)] if plan.prefer else None
            session = f"drill-{run_id}-{index}" if traffic.sessions else None
            self.streams.stream(model_name, traffic, mode, trace, live, prefer=prefer, session=session)

        def conversation(index: int) -> None:
            """One session of `session_turns` chat turns; a turn that failed ends it (the next has no answer)."""
            mode = "greedy" if index % 2 == 0 else "seeded"
            classes = traffic.session_classes
            session_class = classes[index % len(classes)] if classes else None
            prefer = plan.prefer[index % len(plan.prefer)] if plan.prefer else None
            answers: list[str] = []
            for turn in range(traffic.session_turns):
                if turn and traffic.session_think_s:
                    self.sleep(traffic.session_think_s)
                if live.stop.is_set():
                    return
                trace = RequestTrace(index=index * traffic.session_turns + turn, sampling=mode,
                                     started_at=self.clock.now(), session_id=f"drill-{run_id}-{index}",
                                     session_class=session_class, turn=turn)
                with live.lock:
                    live.traces.append(trace)
                self.streams.stream(model_name, traffic, mode, trace, live, prefer=prefer,
                                    session=trace.session_id, messages=chat_messages(traffic, answers))
                if trace.error:
                    return
                answers.append(trace.text)

        injection_s = 0.0

        def inject() -> None:
            nonlocal fault_at, fault_wall, injection_s
            metrics.FAULTS.labels(fault=plan.fault.value).inc()
            fault_at, fault_wall, injection_s = stamp_fault(self.clock, plan.inject)

        next_abort_check = self.clock.now()
        operator_abort: str | None = None
        futures: list[Future[None]] = []
        submitted = 0
        with ThreadPoolExecutor(max_workers=traffic.concurrency, thread_name_prefix="drill-traffic") as pool:
            while True:
                # Steady traffic: `concurrency` streams at a time, `requests` at least; an outage fault that
                # keeps traffic going gets more until it is cleared.
                in_flight = sum(1 for f in futures if not f.done())
                held = plan.keep_traffic and cleared_at is None
                while not tripped and in_flight < traffic.concurrency and (submitted < traffic.requests or held):
                    futures.append(pool.submit(one, submitted))
                    submitted += 1
                    in_flight += 1
                # An outage fault stays on for its whole hold, traffic or not; the others end with the traffic.
                outage = plan.hold_s is not None and cleared_at is None
                traffic_done = submitted >= traffic.requests and (plan.keep_traffic or in_flight == 0)
                if in_flight == 0 and not (outage and not tripped):
                    break
                now = self.clock.now()
                if fault_at is None and (live.tokens_seen >= traffic.fault_after_tokens
                                         or (outage and traffic_done)):
                    inject()
                elif fault_at is not None and cleared_at is None:
                    plan.tick(now)
                    if plan.hold_s is not None and now >= fault_at + plan.hold_s:
                        plan.clear()
                        cleared_at = self.clock.now()
                with live.lock:
                    snapshot = [t for t in live.traces if not plan.documented_refusal(t)]
                tripped = tripped or self._stop_condition(stops, snapshot)
                if not tripped and self.clock.now() >= next_abort_check:
                    next_abort_check = self.clock.now() + 0.5
                    operator_abort = self._aborted_by_operator(run_id)
                    tripped = operator_abort
                if tripped:
                    live.stop.set()
                    break
                self.sleep(0.02)
            if tripped:
                for future in futures:
                    future.cancel()  # not started yet: never sent; in flight: finish (the gateway bounds them)
        if fault_at is None:  # traffic ended before the threshold: fault now so the drill still drills
            inject()
        assert fault_at is not None and fault_wall is not None
        if cleared_at is None:
            plan.clear()
            cleared_at = self.clock.now()
        plan.after_clear()
        for instance in slowed if plan.slow is not None else []:
            engines.admin(instance, {})  # instances the plan does not restart: the token delay taken off
        traces = sorted(live.traces, key=lambda t: t.index)
        recomputed = faults.gateway_metric(gateways, RECOMPUTED) - recomputed_before
        report = self.reports.build(meta, plan, traces, expected, fault_at, fault_wall, cleared_at, first_event,
                                    targets, baseline_ttft, tripped, model_name, traffic, recomputed=recomputed,
                                    expected_turns=expected_turns, injection_s=injection_s)
        if operator_abort:  # already aborted through the API; the fault is rolled back, the row is final
            return DrillOutcome(run_id, DrillRunState.ABORTED, report)
        with session_scope(self.factory) as session:
            if tripped:
                run = service.abort(session, run_id=run_id, reason=f"stop condition: {tripped}", actor=RUNNER_ACTOR,
                                    clock=self.clock, report=report)
                return DrillOutcome(run_id, DrillRunState(run.state), report)
            run = service.get_run_or_raise(session, run_id=run_id, fresh=True)
            run = service.advance(session, run=run, event=DrillRunEvent.FAULT_CLEARED, clock=self.clock)
        with session_scope(self.factory) as session:
            run = service.get_run_or_raise(session, run_id=run_id, fresh=True)
            event = DrillRunEvent.PASS if report["passed"] else DrillRunEvent.FAIL
            run = service.advance(session, run=run, event=event, clock=self.clock, report=report,
                                  failure=None if report["passed"] else "; ".join(report["follow_ups"])[:2000])
            return DrillOutcome(run_id, DrillRunState(run.state), report)

    # -- stop conditions ----------------------------------------------------
    @staticmethod
    def _stop_condition(stops: StopConditions, traces: list[RequestTrace]) -> str | None:
        return stop_condition_tripped(stops, traces)

    def _aborted_by_operator(self, run_id: int) -> str | None:
        with session_scope(self.factory) as session:
            run = service.get_run_or_raise(session, run_id=run_id, fresh=True)
            if run.state == DrillRunState.ABORTED:
                return f"aborted by an operator: {run.abort_reason}"
        return None


def stop_condition_tripped(stops: StopConditions, traces: list[RequestTrace]) -> str | None:
    """Pure: the first stop condition crossed by the finished requests, or None."""
    finished = [t for t in traces if t.finished]
    if len(finished) < stops.min_requests:
        return None
    rate = measure.error_rate(finished)
    if stops.max_error_rate is not None and rate > stops.max_error_rate:
        return f"error rate {rate:.2f} > {stops.max_error_rate:.2f}"
    p99 = measure.ttft_p99(finished)
    if stops.ttft_p99_ms is not None and p99 is not None and p99 * 1000.0 > stops.ttft_p99_ms:
        return f"TTFT p99 {p99 * 1000.0:.1f} ms > {stops.ttft_p99_ms:.3f} ms"
    return None


# The name the instance drills were first written under (tasks, CLI, demo and tests call it).
InstanceDrillRunner = DrillRunner
